"""The webhook outbox of the SQLite store (see `base.WebhookOutbox`)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence

from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookTarget,
)
from comfyfleet.store.sqlite_parts import webhooks_sql as webhooks
from comfyfleet.store.sqlite_parts.access import SQLiteAccess


class SQLiteWebhookOutbox(SQLiteAccess):
    """Deliveries written with the job ends they report, leased out to senders."""

    async def set_webhook_targets(self, targets: Sequence[WebhookTarget]) -> None:
        """Replace the server-wide targets that job ends are matched against."""
        await self._write(functools.partial(webhooks.set_targets, targets=list(targets)))

    async def claim_webhook_deliveries(
        self, limit: int, lease_seconds: float
    ) -> list[WebhookDelivery]:
        """Up to `limit` due, unleased deliveries, leased for `lease_seconds`."""
        now = self._clock()
        op = functools.partial(
            webhooks.claim, limit=limit, lease=uuid.uuid4().hex, now=now, until=now + lease_seconds
        )
        return await self._write(op)

    async def record_webhook_attempt(
        self, delivery_id: str, lease: str, attempt: DeliveryAttempt
    ) -> bool:
        op = functools.partial(
            webhooks.record,
            delivery_id=delivery_id,
            lease=lease,
            attempt=attempt,
            now=self._clock(),
        )
        return await self._write(op)

    async def release_webhook_delivery(self, delivery_id: str, lease: str, next_at: float) -> bool:
        op = functools.partial(
            webhooks.release, delivery_id=delivery_id, lease=lease, next_at=next_at
        )
        return await self._write(op)

    async def webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None:
        return await self._read(functools.partial(webhooks.one, delivery_id=delivery_id))

    async def webhook_deliveries(
        self,
        *,
        state: DeliveryState | None = None,
        prompt_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WebhookDelivery], int]:
        """A page of deliveries, newest first, and how many match."""
        op = functools.partial(
            webhooks.page, state=state, prompt_id=prompt_id, limit=limit, offset=offset
        )
        return await self._read(op)

    async def retry_webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None:
        op = functools.partial(webhooks.retry, delivery_id=delivery_id, now=self._clock())
        return await self._write(op)

    async def prune_webhook_deliveries(self, before: float) -> int:
        return await self._write(functools.partial(webhooks.prune, before=before))
