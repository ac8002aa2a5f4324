"""Comfy API v2 asset records, kept in the SQLite store."""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import replace
from typing import Any

from comfyfleet.domain.assets import AssetRecord
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts.access import SQLiteAccess

Q = load_blocks("sqlite_queries.sql")


class SQLiteAssets(SQLiteAccess):
    """Asset records by tenant and id, and by the hash of their bytes."""

    async def add_asset(self, record: AssetRecord) -> AssetRecord:
        saved = replace(record, created_at=self._clock())
        await self._write(functools.partial(_insert, record=saved))
        return saved

    async def asset(self, tenant: str, asset_id: str) -> AssetRecord | None:
        return await self._read(
            functools.partial(_one, query="asset_select", key=(tenant, asset_id))
        )

    async def asset_by_hash(self, tenant: str, digest: str) -> AssetRecord | None:
        return await self._read(
            functools.partial(_one, query="asset_by_hash", key=(tenant, digest))
        )

    async def delete_asset(self, tenant: str, asset_id: str) -> bool:
        return await self._write(functools.partial(_delete, key=(tenant, asset_id)))


def _insert(conn: sqlite3.Connection, record: AssetRecord) -> None:
    conn.execute(
        Q["asset_insert"],
        (
            record.tenant,
            record.id,
            record.hash,
            record.size,
            record.content_type,
            record.file_path,
            record.blob,
            record.created_at,
        ),
    )


def _one(conn: sqlite3.Connection, query: str, key: tuple[str, str]) -> AssetRecord | None:
    row: Any = conn.execute(Q[query], key).fetchone()
    return None if row is None else AssetRecord(*row)


def _delete(conn: sqlite3.Connection, key: tuple[str, str]) -> bool:
    return conn.execute(Q["asset_delete"], key).rowcount == 1
