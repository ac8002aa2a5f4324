"""The webhook outbox's SQL on SQLite: operations the store runs on its threads.

Deliveries are recorded by `enqueue`, which the store's finish and cancel operations
call inside their own transaction, so a job's end and its deliveries commit together.
A server-wide target's events and tenants are kept as space-delimited words with a
space at each end (` job.failed job.succeeded `), so one `instr` tells a match.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookEvent,
    WebhookTarget,
)
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("sqlite_queries.sql")

ENQUEUE = Q["webhook_enqueue"]
_FIELDS = (
    "id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since, "
    "next_at, delivered_at, last_status, last_error, body, lease"
)
CLAIM = Q["webhook_claim"]
RECORD = Q["webhook_record"]
RELEASE = Q["webhook_release"]
SELECT_ONE = Q["webhook_select_one"]
RETRY = Q["webhook_retry"]
PRUNE = Q["webhook_prune"]


def _words(values: frozenset[str] | None) -> str | None:
    return None if values is None else " " + " ".join(sorted(values)) + " "


def _row(row: Sequence[Any]) -> WebhookDelivery:
    return WebhookDelivery.from_row(row)


# -- writer thread ------------------------------------------------------------------


def enqueue(conn: sqlite3.Connection, prompt_id: str, event: WebhookEvent, now: float) -> None:
    """The deliveries of a job that just ended (inside the transaction that ended it)."""
    conn.execute(ENQUEUE, {"prompt_id": prompt_id, "event": event.value, "now": now})


def set_targets(conn: sqlite3.Connection, targets: Sequence[WebhookTarget]) -> None:
    conn.execute(Q["webhook_clear_targets"])
    conn.executemany(
        "INSERT INTO webhook_targets (name, url, events, tenants) VALUES (?, ?, ?, ?)",
        [(t.name, t.url, _words(t.events), _words(t.tenants)) for t in targets],
    )


def claim(
    conn: sqlite3.Connection, limit: int, lease: str, now: float, until: float
) -> list[WebhookDelivery]:
    params = {"lease": lease, "until": until, "now": now, "limit": limit}
    rows = conn.execute(CLAIM, params).fetchall()
    return sorted(map(_row, rows), key=lambda d: (d.next_at, d.created_at))


def record(
    conn: sqlite3.Connection, delivery_id: str, lease: str, attempt: DeliveryAttempt, now: float
) -> bool:
    params = {
        "id": delivery_id,
        "lease": lease,
        "state": attempt.state.value,
        "next_at": attempt.next_at,
        "now": now,
        "status": attempt.status,
        "error": attempt.error,
        "body": attempt.body,
    }
    return conn.execute(RECORD, params).rowcount == 1


def release(conn: sqlite3.Connection, delivery_id: str, lease: str, next_at: float) -> bool:
    return conn.execute(RELEASE, (next_at, delivery_id, lease)).rowcount == 1


def retry(conn: sqlite3.Connection, delivery_id: str, now: float) -> WebhookDelivery | None:
    found = conn.execute(RETRY, {"id": delivery_id, "now": now}).fetchone()
    return None if found is None else _row(found)


def prune(conn: sqlite3.Connection, before: float) -> int:
    return conn.execute(PRUNE, (before,)).rowcount


# -- reader threads ------------------------------------------------------------------


def one(conn: sqlite3.Connection, delivery_id: str) -> WebhookDelivery | None:
    found = conn.execute(SELECT_ONE, (delivery_id,)).fetchone()
    return None if found is None else _row(found)


def page(
    conn: sqlite3.Connection,
    state: DeliveryState | None,
    prompt_id: str | None,
    limit: int,
    offset: int,
) -> tuple[list[WebhookDelivery], int]:
    wanted = {"state": None if state is None else state.value, "prompt_id": prompt_id}
    params: dict[str, Any] = {key: value for key, value in wanted.items() if value is not None}
    where = " AND ".join(f"{key} = :{key}" for key in params)
    where = f"WHERE {where}" if where else ""
    params.update(limit=limit, offset=offset)
    rows = conn.execute(
        f"SELECT {_FIELDS} FROM webhook_deliveries {where} ORDER BY pos DESC "
        "LIMIT :limit OFFSET :offset",
        params,
    ).fetchall()
    total: int = conn.execute(
        f"SELECT count(*) FROM webhook_deliveries {where}", params
    ).fetchone()[0]
    return [_row(row) for row in rows], total
