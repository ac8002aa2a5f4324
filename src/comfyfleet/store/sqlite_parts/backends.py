"""Backends added at run time, kept in the SQLite store."""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Any

from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts import backend_owners_sql as backend_owners
from comfyfleet.store.sqlite_parts.access import SQLiteAccess

Q = load_blocks("sqlite_queries.sql")

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class SQLiteBackends(SQLiteAccess):
    """The fleet's added backends, by name, in the order they were added."""

    async def backends(self) -> list[dict[str, Any]]:
        """Backends added at run time, in the order they were added."""
        return await self._read(_backends)

    async def save_backend(self, name: str, spec: dict[str, Any]) -> None:
        op = functools.partial(_save_backend, name=name, spec=spec, now=self._clock())
        await self._write(op)

    async def delete_backend(self, name: str) -> bool:
        return await self._write(functools.partial(_delete_backend, name=name))


def _backends(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute(Q["select_backends"]).fetchall()
    return [json.loads(spec) for (spec,) in rows]


def _save_backend(conn: sqlite3.Connection, name: str, spec: dict[str, Any], now: float) -> None:
    conn.execute(Q["save_backend"], (name, _dumps(spec), now))


def _delete_backend(conn: sqlite3.Connection, name: str) -> bool:
    conn.execute(backend_owners.FORGET, (name,))  # its owner and client id go with it
    return conn.execute(Q["delete_backend"], (name,)).rowcount == 1
