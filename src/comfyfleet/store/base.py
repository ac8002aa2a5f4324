"""The JobStore interface every store implements (sqlite.py, postgres.py): the seams of
store/seams/ composed, and the errors a store raises."""

from __future__ import annotations

from typing import Protocol

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.errors import ComfyfleetError
from comfyfleet.store.seams.assets import AssetRecords as AssetRecords
from comfyfleet.store.seams.backend_owners import BackendOwners as BackendOwners
from comfyfleet.store.seams.backends import RunTimeBackends as RunTimeBackends
from comfyfleet.store.seams.event_log import PromptEventLog as PromptEventLog
from comfyfleet.store.seams.history import JobHistory as JobHistory
from comfyfleet.store.seams.jobs import MAX_CANDIDATES as MAX_CANDIDATES
from comfyfleet.store.seams.jobs import MAX_QUEUE_POSITION as MAX_QUEUE_POSITION
from comfyfleet.store.seams.jobs import JobQueue as JobQueue
from comfyfleet.store.seams.journal import RemoteJobJournal as RemoteJobJournal
from comfyfleet.store.seams.leases import GatewayLeases as GatewayLeases
from comfyfleet.store.seams.leases import WorkWake as WorkWake
from comfyfleet.store.seams.published_nodes import PublishedNodes as PublishedNodes
from comfyfleet.store.seams.webhooks import WebhookOutbox as WebhookOutbox


def clamp_candidates(limit: int) -> int:
    """A page size for `candidates`, within 1..MAX_CANDIDATES."""
    return max(1, min(limit, MAX_CANDIDATES))


class StoreError(ComfyfleetError):
    """The store failed (I/O, corruption, driver error); the cause is chained."""


class DuplicateJob(StoreError):
    """A job with this prompt_id already exists."""


class PendingLimitReached(ComfyfleetError):
    """`submit` with a pending limit: that many jobs are pending already, nothing was
    queued (the store works; the queue is full)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} prompts are pending; try again later")
        self.limit = limit


class QueuedLimitReached(ComfyfleetError):
    """`submit` with a tenant's cap (`max_queued`): the job's tenant has that many jobs
    pending already, nothing was queued. Names only the cap: other tenants' queues are
    none of the caller's business."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"at most {limit} prompts of one tenant may be pending")
        self.limit = limit


class GatewayIdInUse(StoreError):
    """Another live process holds this gateway id (`holder`)."""

    def __init__(self, message: str, holder: GatewayRecord) -> None:
        super().__init__(message)
        self.holder = holder


class JobStore(
    JobQueue,
    AssetRecords,
    JobHistory,
    RunTimeBackends,
    GatewayLeases,
    BackendOwners,
    RemoteJobJournal,
    WebhookOutbox,
    PromptEventLog,
    PublishedNodes,
    Protocol,
):
    """Everything a store does: the seams of store/seams/, one store object."""
