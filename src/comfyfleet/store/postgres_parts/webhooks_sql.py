"""The webhook outbox on PostgreSQL: what the store runs for each outbox verb.

`db` is an asyncpg pool or connection; every statement is a named block of
postgres_queries.sql. The deliveries of a job's end are recorded by the job-ending
statements themselves (`with_deliveries`). Driver errors are wrapped by the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookTarget,
)
from comfyfleet.store.postgres_text import from_db, to_db, to_db_or_none
from comfyfleet.store.sql_blocks import load_blocks

W = load_blocks("postgres_queries.sql")
PLACEHOLDER = "{webhook_deliveries}"


def with_deliveries(blocks: dict[str, str]) -> dict[str, str]:
    """`blocks` with each `{webhook_deliveries}` replaced by the outbox's INSERT; the
    INSERT itself goes (a part of other statements, it does not run on its own)."""
    insert = W["webhook_deliveries"]
    return {
        name: sql.replace(PLACEHOLDER, insert)
        for name, sql in blocks.items()
        if name != "webhook_deliveries"
    }


def _row(row: Sequence[Any]) -> WebhookDelivery:
    return WebhookDelivery.from_row(row, from_db)


def _sorted(values: frozenset[str] | None) -> list[str] | None:
    return None if values is None else sorted(values)


async def set_targets(conn: Any, targets: Sequence[WebhookTarget]) -> None:
    await conn.execute(W["clear_webhook_targets"])
    await conn.executemany(
        W["add_webhook_target"],
        [(t.name, t.url, _sorted(t.events), _sorted(t.tenants)) for t in targets],
    )


async def claim(db: Any, limit: int, lease: str, now: float, until: float) -> list[WebhookDelivery]:
    rows = await db.fetch(W["claim_webhook_deliveries"], now, limit, lease, until)
    return sorted(map(_row, rows), key=lambda d: (d.next_at, d.created_at))


async def record(
    db: Any, delivery_id: str, lease: str, attempt: DeliveryAttempt, now: float
) -> bool:
    done = await db.fetchval(
        W["record_webhook_attempt"],
        delivery_id,
        lease,
        attempt.state.value,
        attempt.next_at,
        now,
        attempt.status,
        to_db_or_none(attempt.error),
        to_db(attempt.body),
    )
    return bool(done)


async def release(db: Any, delivery_id: str, lease: str, next_at: float) -> bool:
    return bool(await db.fetchval(W["release_webhook_delivery"], delivery_id, lease, next_at))


async def one(db: Any, delivery_id: str) -> WebhookDelivery | None:
    found = await db.fetchrow(W["webhook_delivery"], to_db(delivery_id))
    return None if found is None else _row(found)


async def page(
    conn: Any,
    state: DeliveryState | None,
    prompt_id: str | None,
    limit: int,
    offset: int,
) -> tuple[list[WebhookDelivery], int]:
    wanted = (None if state is None else state.value, to_db_or_none(prompt_id))
    rows = await conn.fetch(W["webhook_deliveries_page"], *wanted, limit, offset)
    total: int = await conn.fetchval(W["webhook_deliveries_total"], *wanted)
    return [_row(row) for row in rows], total


async def retry(db: Any, delivery_id: str, now: float) -> WebhookDelivery | None:
    found = await db.fetchrow(W["retry_webhook_delivery"], to_db(delivery_id), now)
    return None if found is None else _row(found)


async def prune(db: Any, before: float) -> int:
    gone: int = await db.fetchval(W["prune_webhook_deliveries"], before)
    return gone
