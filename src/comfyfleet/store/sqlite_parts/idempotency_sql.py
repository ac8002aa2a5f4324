"""Idempotency keys in the SQLite store: operations run on its threads.

The writer records a key inside the transaction that inserts its job (see
`sqlite._insert_job`), so a key never exists without its job nor the job without it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from comfyfleet.domain.idempotency import IDEMPOTENCY_WINDOW, IdempotentRequest
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("sqlite_queries.sql")

_dumps = json.JSONEncoder(separators=(",", ":")).encode

CLAIM = Q["idempotency_claim"]
FIRST = Q["idempotency_first"]
FORGET_EXPIRED = Q["idempotency_forget_expired"]


def claim(
    conn: sqlite3.Connection, tenant: str, request: IdempotentRequest, prompt_id: str, now: float
) -> IdempotentRequest | None:
    """Record the key for `prompt_id` (writer thread, in the job's transaction); None when
    recorded, else the key's first request (and nothing written)."""
    cutoff = now - IDEMPOTENCY_WINDOW
    conn.execute(FORGET_EXPIRED, (cutoff,))
    params = (tenant, request.key, request.request_hash, prompt_id, _dumps(request.answer), now)
    if conn.execute(CLAIM, (*params, cutoff)).fetchone() is not None:
        return None
    first = _first(conn, tenant, request.key, cutoff)
    assert first is not None  # the conflicting row is fresh, and this transaction holds it
    return first


def first(conn: sqlite3.Connection, tenant: str, key: str, now: float) -> IdempotentRequest | None:
    """The key's first request, if recorded within the window (reader thread)."""
    return _first(conn, tenant, key, now - IDEMPOTENCY_WINDOW)


def _first(
    conn: sqlite3.Connection, tenant: str, key: str, cutoff: float
) -> IdempotentRequest | None:
    row: Any = conn.execute(FIRST, (tenant, key, cutoff)).fetchone()
    if row is None:
        return None
    return IdempotentRequest(row[0], row[1], json.loads(row[2]), row[3])
