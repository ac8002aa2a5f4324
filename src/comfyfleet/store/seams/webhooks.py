"""The webhook outbox: deliveries written with the job ends they report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookTarget,
)


class WebhookOutbox(Protocol):
    """The webhook deliveries of job ends, recorded in the same transaction as the end.

    `finish`, `cancel` and `cancel_all_pending` record one pending delivery per target
    that wants the end's event (see domain.webhooks): the job's own
    `extra_data.webhook_url` (for the events listed in `extra_data.webhook_events`, every
    one when it is not a list), and each server-wide target whose events and tenants
    match. Deliveries outlive their jobs (retention does not remove them).
    """

    async def set_webhook_targets(self, targets: Sequence[WebhookTarget]) -> None:
        """Replace the server-wide targets that job ends are matched against."""

    async def claim_webhook_deliveries(
        self, limit: int, lease_seconds: float
    ) -> list[WebhookDelivery]:
        """Up to `limit` pending deliveries that are due and not leased, the longest due
        first, each leased for `lease_seconds` under a token (its `lease`): no other
        claim returns it while the lease runs."""

    async def record_webhook_attempt(
        self, delivery_id: str, lease: str, attempt: DeliveryAttempt
    ) -> bool:
        """How an attempt went (the body is kept from the first attempt on); the lease
        ends. False, and nothing written, when the lease is no longer this one."""

    async def release_webhook_delivery(self, delivery_id: str, lease: str, next_at: float) -> bool:
        """Give a claimed delivery back unsent (no attempt counted), due at `next_at`.
        False when the lease is no longer this one."""

    async def webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None: ...

    async def webhook_deliveries(
        self,
        *,
        state: DeliveryState | None = None,
        prompt_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WebhookDelivery], int]:
        """A page of deliveries, newest first, and how many match."""

    async def retry_webhook_delivery(self, delivery_id: str) -> WebhookDelivery | None:
        """A dead (or delivered) delivery back to pending, due now, its retry window
        starting now; None when it is unknown or still pending."""

    async def prune_webhook_deliveries(self, before: float) -> int:
        """Delete delivered and dead deliveries last changed before this time."""
