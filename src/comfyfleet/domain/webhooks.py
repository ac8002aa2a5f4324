"""Webhook deliveries as the store keeps them: one per job end and target, sent at least
once, each under a stable id (its `webhook-id`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from comfyfleet.domain.jobs import JobStatus

#: The `extra_data` keys of a prompt's own webhook.
URL_KEY = "webhook_url"
EVENTS_KEY = "webhook_events"


class WebhookEvent(StrEnum):
    SUCCEEDED = "job.succeeded"
    FAILED = "job.failed"
    INTERRUPTED = "job.interrupted"
    CANCELLED = "job.cancelled"


#: The event a job's end raises, by the status it ended with.
EVENT_OF = {
    JobStatus.SUCCESS: WebhookEvent.SUCCEEDED,
    JobStatus.ERROR: WebhookEvent.FAILED,
    JobStatus.INTERRUPTED: WebhookEvent.INTERRUPTED,
    JobStatus.CANCELLED: WebhookEvent.CANCELLED,
}
STATUS_OF = {event: status for status, event in EVENT_OF.items()}


class DeliveryState(StrEnum):
    PENDING = "pending"  # due at `next_at` (again, after a failed attempt)
    DELIVERED = "delivered"  # a 2xx answer
    DEAD = "dead"  # every attempt of its retry window failed: kept until retried by id


@dataclass(frozen=True)
class WebhookTarget:
    """A server-wide webhook as the store knows it (its secret stays in the config).
    `events` and `tenants` None: every one."""

    name: str
    url: str
    events: frozenset[WebhookEvent] | None = None
    tenants: frozenset[str] | None = None


@dataclass(frozen=True)
class WebhookDelivery:
    id: str  # the `webhook-id`, the same on every attempt
    prompt_id: str
    tenant: str
    event: WebhookEvent
    target: str | None  # a server-wide target's name; None: the prompt's own webhook_url
    url: str  # where it went when recorded (a target's current url is used to send)
    state: DeliveryState
    attempts: int
    created_at: float
    retry_since: float  # the retry window's start (its creation, or a retry by id)
    next_at: float
    delivered_at: float | None
    last_status: int | None  # the HTTP status of the last attempt, if it got one
    last_error: str | None
    body: str | None  # the body as first sent; None before the first attempt
    lease: str | None = None  # the claim's token, on a claimed delivery

    @classmethod
    def from_row(cls, row: Sequence[Any], text: Callable[[str], str] = str) -> WebhookDelivery:
        """A delivery from a store's row (its columns in this class's order); `text`
        decodes the columns that hold outside text (the prompt id, the error, the body)."""
        return cls(
            id=row[0],
            prompt_id=text(row[1]),
            tenant=row[2],
            event=WebhookEvent(row[3]),
            target=row[4],
            url=row[5],
            state=DeliveryState(row[6]),
            attempts=row[7],
            created_at=row[8],
            retry_since=row[9],
            next_at=row[10],
            delivered_at=row[11],
            last_status=row[12],
            last_error=None if row[13] is None else text(row[13]),
            body=None if row[14] is None else text(row[14]),
            lease=row[15],
        )


@dataclass(frozen=True)
class DeliveryAttempt:
    """How one attempt went: delivered, or failed and due again at `next_at` (None: dead)."""

    delivered: bool
    body: str
    status: int | None = None
    error: str | None = None
    next_at: float | None = None

    @property
    def state(self) -> DeliveryState:
        if self.delivered:
            return DeliveryState.DELIVERED
        return DeliveryState.PENDING if self.next_at is not None else DeliveryState.DEAD
