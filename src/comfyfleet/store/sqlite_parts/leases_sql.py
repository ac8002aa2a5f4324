"""GatewayRecord leases in the SQLite store (the `GatewayLeases` verbs; see store/base.py).

A job's lease is its owner's: one heartbeat renews the lease of every job a gateway
runs. A job is orphaned once its owner's lease has run out, or when it has no owner
(it was running before leases were recorded).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts import schema as schema

Q = load_blocks("sqlite_queries.sql")

SELECT_HOLDER = Q["lease_select_holder"]
UPSERT_GATEWAY = Q["lease_upsert_gateway"]
HEARTBEAT = Q["lease_heartbeat"]
LEAVE = Q["lease_leave"]
LIVE_GATEWAYS = Q["lease_live_gateways"]
REQUEUE_ORPHANED = Q["lease_requeue_orphaned"]
ADOPT = Q["lease_adopt"]


def migrate(conn: sqlite3.Connection) -> None:
    """Version 5: jobs get their owner, and the gateways table appears."""
    if not schema.has_column(conn, "jobs", "owner"):
        conn.execute("ALTER TABLE jobs ADD COLUMN owner TEXT")
    schema.apply(conn, 5)


def gateway(row: Sequence[Any], running: int = 0) -> GatewayRecord:
    id_, instance, host, pid, url, started_at, seen_at, lease_until = row[:8]
    return GatewayRecord(id_, instance, host, pid, url, started_at, seen_at, lease_until, running)


def holder(conn: sqlite3.Connection, gateway_id: str) -> GatewayRecord | None:
    row = conn.execute(SELECT_HOLDER, (gateway_id,)).fetchone()
    return None if row is None else gateway(row)


def join(
    conn: sqlite3.Connection, joining: GatewayRecord, lease: float, now: float, replace: str | None
) -> GatewayRecord | None:
    """Register `joining`; the other live instance holding its id instead, if any (but
    `replace`, known dead)."""
    held = holder(conn, joining.id)
    if (
        held is not None
        and held.instance not in (joining.instance, replace)
        and held.lease_until >= now
    ):
        return held
    conn.execute(
        UPSERT_GATEWAY,
        (
            joining.id,
            joining.instance,
            joining.host,
            joining.pid,
            joining.url,
            joining.started_at,
            now,
            now + lease,
        ),
    )
    return None


def live(conn: sqlite3.Connection, now: float) -> list[GatewayRecord]:
    rows = conn.execute(LIVE_GATEWAYS, (now,)).fetchall()
    return [gateway(row, row[8]) for row in rows]


def adopt(
    conn: sqlite3.Connection, owner: str, prompt_id: str, attempt: int, now: float, note: str
) -> bool:
    if conn.execute(ADOPT, (owner, prompt_id, attempt, now)).rowcount != 1:
        return False
    conn.execute(
        "INSERT INTO events (prompt_id, attempt, seq, type, data) VALUES (?, ?, -1, 'requeued', ?)",
        (prompt_id, attempt, note),
    )
    return True
