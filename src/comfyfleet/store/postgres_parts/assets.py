"""Comfy API v2 asset records, kept in the PostgreSQL store."""

from __future__ import annotations

from dataclasses import replace

from comfyfleet.domain.assets import AssetRecord
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q
from comfyfleet.store.postgres_text import from_db, to_db


class PostgresAssets(PostgresAccess):
    """Asset records by tenant and id, and by the hash of their bytes."""

    async def add_asset(self, record: AssetRecord) -> AssetRecord:
        saved = replace(record, created_at=self._clock())
        params = (
            to_db(saved.tenant),
            to_db(saved.id),
            saved.hash,
            saved.size,
            to_db(saved.content_type),
            to_db(saved.file_path),
            to_db(saved.blob),
            saved.created_at,
        )
        await self._commit(lambda db: db.execute(Q["asset_insert"], *params))
        return saved

    async def asset(self, tenant: str, asset_id: str) -> AssetRecord | None:
        return await self._one("asset_select", tenant, asset_id)

    async def asset_by_hash(self, tenant: str, digest: str) -> AssetRecord | None:
        return await self._one("asset_by_hash", tenant, digest)

    async def delete_asset(self, tenant: str, asset_id: str) -> bool:
        key = (to_db(tenant), to_db(asset_id))
        deleted = await self._commit(lambda db: db.fetchval(Q["asset_delete"], *key))
        return bool(deleted)

    async def _one(self, query: str, tenant: str, key: str) -> AssetRecord | None:
        params = (to_db(tenant), to_db(key))
        row = await self._run(lambda db: db.fetchrow(Q[query], *params))
        if row is None:
            return None
        return AssetRecord(
            from_db(row[0]),
            from_db(row[1]),
            row[2],
            row[3],
            from_db(row[4]),
            from_db(row[5]),
            from_db(row[6]),
            row[7],
        )
