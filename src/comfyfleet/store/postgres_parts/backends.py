"""Backends added at run time, kept in the PostgreSQL store."""

from __future__ import annotations

from typing import Any

from comfyfleet.store.postgres_parts import backend_owners_sql as backend_owners
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q, dumps, loads
from comfyfleet.store.postgres_text import to_db


class PostgresBackends(PostgresAccess):
    """The fleet's added backends, by name, in the order they were added."""

    async def backends(self) -> list[dict[str, Any]]:
        """Backends added at run time, in the order they were added."""
        rows = await self._run(lambda db: db.fetch(Q["select_backends"]))
        return [loads(spec) for (spec,) in rows]

    async def save_backend(self, name: str, spec: dict[str, Any]) -> None:
        params = (to_db(name), dumps(spec), self._clock())
        await self._commit(lambda db: db.execute(Q["save_backend"], *params))

    async def delete_backend(self, name: str) -> bool:
        async def delete(conn: Any) -> bool:
            await backend_owners.forget(conn, name)  # its owner and client id go with it
            return bool(await conn.fetchval(Q["delete_backend"], to_db(name)))

        return await self._write(delete)
