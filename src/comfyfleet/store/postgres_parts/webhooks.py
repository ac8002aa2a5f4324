"""The webhook outbox of the PostgreSQL store (see `base.WebhookOutbox`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookTarget,
)
from comfyfleet.store.postgres_parts import webhooks_sql as webhooks
from comfyfleet.store.postgres_parts.access import PostgresAccess


class PostgresWebhookOutbox(PostgresAccess):
    """Deliveries written with the job ends they report, leased out to senders."""

    async def set_webhook_targets(self, targets: Sequence[WebhookTarget]) -> None:
        """Replace the server-wide targets that job ends are matched against."""
        await self._write(lambda conn: webhooks.set_targets(conn, targets))

    async def claim_webhook_deliveries(
        self, limit: int, lease_seconds: float
    ) -> list[WebhookDelivery]:
        """Up to `limit` due, unleased deliveries, leased for `lease_seconds`."""
        now, lease = self._clock(), uuid.uuid4().hex
        return await self._commit(
            lambda db: webhooks.claim(db, limit, lease, now, now + lease_seconds)
        )

    async def record_webhook_attempt(
        self, delivery_id: str, lease: str, attempt: DeliveryAttempt
    ) -> bool:
        now = self._clock()
        return await self._commit(lambda db: webhooks.record(db, delivery_id, lease, attempt, now))

    async def release_webhook_delivery(self, delivery_id: str, lease: str, next_at: float) -> bool:
        return await self._commit(lambda db: webhooks.release(db, delivery_id, lease, next_at))

    async def webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None:
        return await self._run(lambda db: webhooks.one(db, delivery_id))

    async def webhook_deliveries(
        self,
        *,
        state: DeliveryState | None = None,
        prompt_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WebhookDelivery], int]:
        """A page of deliveries, newest first, and how many match."""
        return await self._snapshot(
            lambda conn: webhooks.page(conn, state, prompt_id, limit, offset)
        )

    async def retry_webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None:
        now = self._clock()
        return await self._commit(lambda db: webhooks.retry(db, delivery_id, now))

    async def prune_webhook_deliveries(self, before: float) -> int:
        return await self._commit(lambda db: webhooks.prune(db, before))
