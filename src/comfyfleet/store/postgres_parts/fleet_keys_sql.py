"""Fleet keys on PostgreSQL: secrets the gateways sharing a store agree on.

`conn` is a connection inside one transaction. Two gateways storing their candidates at
once meet at the primary key: the second waits for the first to commit, stores nothing,
and reads the first one's key. Driver errors are wrapped by the store.
"""

from __future__ import annotations

from typing import Any

from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("postgres_queries.sql")


async def keep(conn: Any, name: str, candidate: bytes, now: float) -> bytes:
    """The key stored under `name`, `candidate` stored first when there is none."""
    await conn.execute(Q["fleet_key_keep_first"], name, candidate, now)
    return bytes(await conn.fetchval(Q["fleet_key"], name))
