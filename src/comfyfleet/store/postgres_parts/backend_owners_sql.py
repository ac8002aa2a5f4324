"""Backend ownership on PostgreSQL: what the store runs for each `BackendOwners` verb.

`db` is an asyncpg pool or connection; every statement is a named block of
postgres_queries.sql. A claim holds a transaction-level advisory lock, so two
gateways claiming at once take turns: a backend is never given to both. Driver errors
are wrapped by the store, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.gateways import BackendOwner
from comfyfleet.store.postgres_text import from_db, from_db_or_none, to_db, to_db_all
from comfyfleet.store.sql_blocks import load_blocks

B = load_blocks("postgres_queries.sql")


def _row(row: Sequence[Any]) -> BackendOwner:
    return BackendOwner(from_db(row[0]), from_db(row[1]), from_db_or_none(row[2]), row[3])


async def claim(
    conn: Any,
    owner: str,
    instance: str,
    offered: list[tuple[str, str]],
    limit: int | None,
    now: float,
    take_lapsed: bool = True,
) -> list[BackendOwner]:
    """On one connection, inside the caller's transaction."""
    await conn.execute(B["lock_backend_claims"])
    leased = await conn.fetchval(B["lease_holds"], to_db(owner), instance, now)
    names = to_db_all(name for name, _ in offered)
    rows = {from_db(r[0]): r for r in await conn.fetch(B["backend_owner_rows"], now, names)}
    taken = 0
    held: list[BackendOwner] = []
    for backend, client_id in offered:
        row = rows.get(backend)
        if row is not None and row[4] is not None and from_db(row[4]) == owner:
            # Still this gateway's, even while its own lease is out (it renews it soon).
            held.append(BackendOwner(backend, from_db(row[1]), owner, row[3]))
            continue
        free = row is None or row[4] is None or (take_lapsed and row[2] is None)
        if not (leased and free and (limit is None or taken < limit)):
            continue
        if row is None:
            await conn.execute(
                B["insert_backend_owner"], to_db(backend), client_id, to_db(owner), now
            )
            held.append(BackendOwner(backend, client_id, owner, now))
        else:
            await conn.execute(B["take_backend"], to_db(backend), to_db(owner), now)
            held.append(BackendOwner(backend, from_db(row[1]), owner, now))
        taken += 1
    return held


async def release(db: Any, owner: str, names: Sequence[str] | None) -> None:
    if names is None:
        await db.execute(B["release_all_backends"], to_db(owner))
    else:
        await db.execute(B["release_backends"], to_db(owner), to_db_all(names))


async def owners(db: Any, now: float) -> list[BackendOwner]:
    return [_row(row) for row in await db.fetch(B["backend_owners"], now)]


async def forget(db: Any, backend: str) -> None:
    await db.execute(B["forget_backend_owner"], to_db(backend))
