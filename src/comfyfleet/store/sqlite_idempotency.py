"""Idempotency keys in the SQLite store: operations run on its threads.

The writer records a key inside the transaction that inserts its job (see
`sqlite._insert_job`), so a key never exists without its job nor the job without it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from comfyfleet.domain.idempotency import IDEMPOTENCY_WINDOW, IdempotentRequest

_dumps = json.JSONEncoder(separators=(",", ":")).encode

# A key older than the window is free again: the upsert takes its row over; a fresh
# one is left alone and returns no row.
CLAIM = """
INSERT INTO idempotency_keys (tenant, key, request_hash, prompt_id, answer, created_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, key) DO UPDATE SET
    request_hash = excluded.request_hash, prompt_id = excluded.prompt_id,
    answer = excluded.answer, created_at = excluded.created_at
WHERE idempotency_keys.created_at <= ?
RETURNING 1
"""
FIRST = """
SELECT key, request_hash, answer, created_at FROM idempotency_keys
WHERE tenant = ? AND key = ? AND created_at > ?
"""
# Each keyed submit forgets a few expired keys, so the table holds about one window.
FORGET_EXPIRED = """
DELETE FROM idempotency_keys WHERE (tenant, key) IN (
    SELECT tenant, key FROM idempotency_keys WHERE created_at <= ? LIMIT 16
)
"""


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
