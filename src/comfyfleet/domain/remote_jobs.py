"""Paid remote jobs run by fan-out nodes, as the journal keeps them: recorded before
they are sent, given the provider's id, finished once."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RemoteJobState(StrEnum):
    SUBMITTING = "submitting"  # recorded, job-creating request not answered yet
    RUNNING = "running"  # the provider gave it an id: it can be polled or cancelled
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


REMOTE_FINAL = frozenset(
    {RemoteJobState.SUCCEEDED, RemoteJobState.FAILED, RemoteJobState.CANCELLED}
)


def check_remote_finish(state: RemoteJobState, result: bytes | None) -> None:
    """ValueError unless `state` is final and only a success carries a result."""
    if state not in REMOTE_FINAL:
        raise ValueError(f"a finished remote job needs a final state, not {state}")
    if result is not None and state != RemoteJobState.SUCCEEDED:
        raise ValueError("only a succeeded remote job has a result")


@dataclass(frozen=True)
class NewRemoteJob:
    """A paid job about to be sent. `resume` says how to find it again (never a secret)."""

    id: str
    request_hash: str
    provider: str
    kind: str  # "image" or "video": the pool it ran in
    prompt_id: str | None
    node_id: str | None
    resume: dict[str, Any] = field(default_factory=dict)
    #: For budgets: whose prompt asked (None: no tenant known), the model priced, and
    #: what the job costs by the price table (None: no price).
    tenant: str | None = None
    model: str | None = None
    cost: float | None = None


@dataclass(frozen=True)
class RemoteJob:
    id: str
    request_hash: str
    provider: str
    kind: str
    prompt_id: str | None
    node_id: str | None
    slot: int | None  # the collector slot it feeds, once a collector has seen it
    state: RemoteJobState
    remote_id: str | None
    resume: dict[str, Any]
    error: dict[str, Any] | None
    attempts: int
    created_at: float
    updated_at: float
    finished_at: float | None = None
    result: bytes | None = None  # the downloaded file of a succeeded job
    result_type: str | None = None  # its media type
    #: The gateway that sends and polls it (`store.owner`); another follows it through
    #: the store, and takes it over only once this one's lease has run out.
    owner: str | None = None
