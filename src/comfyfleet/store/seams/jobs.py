"""Jobs and the queue: submit, claims fenced by attempt, finish, cancel, counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from comfyfleet.domain.idempotency import IdempotentRequest
from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob
from comfyfleet.domain.shares import TenantCounts
from comfyfleet.store.commit_times import CommitTimes

#: The most candidates one read returns.
MAX_CANDIDATES = 256
#: The deepest place `queue_position` counts to: a job further back reads as this, so
#: one read walks at most this many index entries however long the queue is.
MAX_QUEUE_POSITION = 10_000


class JobQueue(Protocol):
    """Every job from submit to its end; one attempt at a time holds it."""

    #: How long its writes take until committed (read by metrics).
    commit_times: CommitTimes
    #: Whether other gateways queue jobs in it too (PostgreSQL): a pending count kept in
    #: memory misses their submits, so admission asks `submit` to count (`max_pending`).
    shared: bool

    async def open(self) -> None:
        """Create or migrate the schema; ready for use afterwards."""

    async def close(self) -> None:
        """Flush pending writes and release connections."""

    # -- queue -------------------------------------------------------------

    async def submit(
        self,
        job: NewJob,
        claim_for: str | None = None,
        *,
        max_pending: int | None = None,
        max_queued: int | None = None,
    ) -> Job:
        """Durably queue a job as pending; raises StoreError if the id exists.

        With `claim_for`, that lane takes the job in the same transaction (running,
        attempt 1): a hand-off to an idle slot while nothing else is pending.

        With `max_pending`, a pending job is queued only while fewer than that many
        jobs are pending in the store, whoever queued them: PendingLimitReached, and
        nothing written, otherwise. Every process sharing the store is counted, and two
        submits at once never both take the last place.

        With `max_queued` (the cap of `job.tenant`), likewise per tenant: queued only
        while fewer than that many of the tenant's jobs are pending (reserved ones
        included), QueuedLimitReached otherwise; checked before `max_pending`. Neither
        limit is asked with `claim_for`: a job handed to a lane is running, not queued.

        With `job.idempotency`, its key is recorded for the job's tenant in the same
        transaction; when the tenant used the key less than IDEMPOTENCY_WINDOW ago,
        nothing is written and IdempotencyKeyTaken carries the first request."""

    async def idempotent_request(self, tenant: str, key: str) -> IdempotentRequest | None:
        """The first submit under `tenant`'s `key`, if recorded less than
        IDEMPOTENCY_WINDOW ago (by the store's clock); None once the key is free."""

    async def candidates(
        self, limit: int, after: Job | None = None, tenant: str | None = None
    ) -> list[Job]:
        """Claimable jobs (pending, set aside for no lane) in dispatch order: at most
        `limit` (clamped to 1..MAX_CANDIDATES), those past `after` (the last job of an
        earlier page) when given, only `tenant`'s when given. A read: nothing is taken,
        no lock is held. The caller chooses among them and takes one with `claim_job`
        or `reserve_job`."""

    async def tenant_counts(self) -> dict[str, TenantCounts]:
        """Each tenant with jobs pending or running: how many of each, fleet-wide (the
        pending ones claimable), and when its oldest claimable one was submitted."""

    async def queue_position(self, prompt_id: str, *, own_tenant: bool = False) -> int | None:
        """Where a pending job stands in dispatch order (front first, then number, then
        submission): 1 for the next to go, counting every pending job ahead of it,
        reserved ones too (only its own tenant's with `own_tenant`), capped at
        MAX_QUEUE_POSITION. None when the job is unknown or not pending. A read over the
        dispatch index: the queue itself is not loaded."""

    async def claim_job(self, job: Job, lane: str, running_cap: int | None = None) -> Job | None:
        """Start a candidate on `lane`: running, attempt + 1, this gateway's (`owner`).
        Fenced: None, and nothing written, when the job is no longer claimable at
        `job.attempt` (claimed, reserved, cancelled or re-queued meanwhile), or, with
        `running_cap`, when its tenant already runs that many jobs (fleet-wide: claims
        of one capped tenant's jobs count one after the other)."""

    async def reserve_job(self, job: Job, lane: str) -> Job | None:
        """Set a candidate aside for `lane` by this gateway (`owner`), fenced as
        `claim_job`: it stays pending, listed and cancellable, with `lane` naming the
        lane, and claims and reservations skip it. A busy lane takes its next job
        ahead of time this way."""

    async def start_reserved(self, job: Job, lane: str) -> Job | None:
        """Start a job reserved for `job.lane` on `lane` (running, attempt + 1), or
        None when it is no longer reserved for `job.lane` (cancelled, given back). With
        `job.lane` None, a pending job set aside for no lane is started so."""

    async def unreserve(self, prompt_ids: Sequence[str]) -> None:
        """Give reserved jobs back to the queue: claims see them again."""

    async def finish(self, prompt_id: str, attempt: int, result: JobResult) -> bool:
        """Record how an attempt ended (job status, history, events, output files)
        in one transaction. False, and nothing written, when `attempt` is stale
        or the job is not running. `result.status` must be terminal; a history entry is
        made when `result.historic` (not for a job cancelled before it began)."""

    async def requeue(
        self, prompt_id: str, attempt: int, reason: dict[str, Any] | None = None
    ) -> bool:
        """Put a running attempt back to pending (its lane was lost). Fenced by attempt.
        A `reason` is kept with the attempt and read back by `attempt_notes`."""

    async def attempt_notes(self, prompt_id: str) -> list[tuple[int, dict[str, Any]]]:
        """(attempt, reason) of each attempt that was given back, oldest first."""

    async def attempt_notes_of(
        self, prompt_ids: Sequence[str]
    ) -> dict[str, list[tuple[int, dict[str, Any]]]]:
        """`attempt_notes` of many jobs in one read; jobs with none are left out."""

    async def requeue_lane(self, lane_prefix: str) -> list[str]:
        """Every job running on a lane whose name starts with `lane_prefix` goes back to
        pending (used at start-up for the local lane), if it is this gateway's (`owner`)
        or orphaned: another live gateway's jobs stay. Returns their ids, in submission
        order."""

    async def cancel(self, prompt_ids: Sequence[str], *, pending_only: bool) -> list[str]:
        """Mark pending (and, unless `pending_only`, running) jobs cancelled; returns
        the ids whose status changed, in the order given. A cancelled job leaves no
        history entry. Unknown or finished ids are ignored."""

    async def cancel_all_pending(self) -> list[str]:
        """`POST /queue {clear: true}`: cancel every pending job; their ids in
        submission order."""

    async def queue(self, *, tenant: str | None = None) -> tuple[list[Job], list[Job]]:
        """(running by start time, pending in dispatch order), one consistent view; only
        the jobs of `tenant` when one is named."""

    async def active_count(self, tenant: str) -> int:
        """How many jobs of `tenant` are pending or running."""

    async def owned(self, prompt_ids: Sequence[str], tenant: str) -> list[str]:
        """The ids among `prompt_ids` whose job belongs to `tenant`, in the order given
        (repeats dropped); unknown ids and other tenants' are left out."""

    async def counts(self) -> dict[JobStatus, int]:
        """Jobs per status; every status is present (0 when none)."""

    async def ping(self) -> None:
        """Return once the store answers a trivial query (StoreError when it cannot)."""

    async def next_number(self) -> int:
        """ComfyUI's submission counter: advances on every call (accepted prompt or
        not). A fresh store starts at 0, as ComfyUI does; after a restart it resumes
        past every counter value stored (front jobs hold it negated; explicit float
        numbers do not count), and never goes back, even after pruning."""

    async def get(self, prompt_id: str) -> Job | None: ...

    async def jobs(
        self,
        *,
        statuses: Sequence[JobStatus] | None = None,
        newest_first: bool = True,
        limit: int | None = None,
        offset: int = 0,
        tenant: str | None = None,
    ) -> tuple[list[Job], int]:
        """A page of jobs by creation time (ties by submission order), and the total
        matching `statuses` (None: all) and `tenant` (None: every tenant)."""
