"""Idempotency keys on PostgreSQL: what the store runs for them.

`conn` is a connection inside the transaction that inserts the key's job (see
`PostgresStore.submit`), so a key never exists without its job nor the job without it.
Two submits with one new key meet at the key's primary key: the second waits for the
first to commit, then finds the key taken. Driver errors are wrapped by the store.
"""

from __future__ import annotations

import json
from typing import Any

from comfyfleet.domain.idempotency import IDEMPOTENCY_WINDOW, IdempotentRequest
from comfyfleet.store.postgres_text import from_db, to_db
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("postgres_queries.sql")
_dumps = json.JSONEncoder(separators=(",", ":")).encode


async def claim(
    conn: Any, tenant: str, request: IdempotentRequest, prompt_id: str, now: float
) -> IdempotentRequest | None:
    """Record the key for `prompt_id`; None when recorded, else the key's first request
    (and nothing written)."""
    cutoff = now - IDEMPOTENCY_WINDOW
    await conn.execute(Q["idempotency_forget_expired"], cutoff)
    recorded = await conn.fetchval(
        Q["idempotency_claim"],
        to_db(tenant),
        to_db(request.key),
        request.request_hash,
        to_db(prompt_id),
        _dumps(request.answer),
        now,
        cutoff,
    )
    if recorded:
        return None
    taken = await first(conn, tenant, request.key, now)
    assert taken is not None  # the conflicting row is fresh and committed
    return taken


async def first(db: Any, tenant: str, key: str, now: float) -> IdempotentRequest | None:
    """The key's first request, if recorded within the window."""
    row = await db.fetchrow(
        Q["idempotency_first"], to_db(tenant), to_db(key), now - IDEMPOTENCY_WINDOW
    )
    if row is None:
        return None
    return IdempotentRequest(from_db(row[0]), row[1], json.loads(row[2]), row[3])
