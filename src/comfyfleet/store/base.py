"""The JobStore interface every store implements (sqlite.py, postgres.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from comfyfleet.domain.gateways import BackendOwner, GatewayRecord
from comfyfleet.domain.idempotency import IdempotentRequest
from comfyfleet.domain.jobs import (
    DispatchKey,
    HistoryEntry,
    Job,
    JobResult,
    JobStatus,
    NewJob,
    OutputFile,
)
from comfyfleet.domain.prompt_events import EventsAppended, NewPromptEvent, PromptEvent
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookDelivery,
    WebhookTarget,
)
from comfyfleet.errors import ComfyfleetError
from comfyfleet.store.commit_times import CommitTimes

#: The most candidates one read returns.
MAX_CANDIDATES = 256

#: Told that work became claimable: by which gateway, and where in the queue (see
#: `watch_work`).
WorkWake = Callable[[str, DispatchKey | None], None]


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


class GatewayIdInUse(StoreError):
    """Another live process holds this gateway id (`holder`)."""

    def __init__(self, message: str, holder: GatewayRecord) -> None:
        super().__init__(message)
        self.holder = holder


class GatewayLeases(Protocol):
    """Several gateways on one store: each claims as `owner`, and its lease (renewed by
    heartbeat) covers every job it runs. Once a lease has run out, the jobs it covered
    are orphaned: another gateway re-queues or adopts them, fenced by attempt."""

    #: The gateway this store claims for: claims, hand-offs and starts record it.
    owner: str

    async def join(
        self, gateway: GatewayRecord, lease: float, *, replace: str | None = None
    ) -> None:
        """Register `gateway` (its id is `owner`) with a lease of `lease` seconds.
        GatewayIdInUse when another instance with that id still holds a lease, unless
        that instance is `replace` (known to be dead: its process is gone)."""

    async def heartbeat(self, lease: float) -> bool:
        """Renew the lease; False when this instance is no longer registered (another
        instance took the id over after the lease ran out)."""

    async def leave(self) -> None:
        """Unregister (a clean stop: its jobs were finished or re-queued)."""

    async def gateways(self) -> list[GatewayRecord]:
        """Every gateway whose lease holds, with the number of jobs each runs, by id."""

    async def fleet_key(self, name: str, candidate: bytes) -> bytes:
        """The secret stored under `name` that every gateway on this store shares:
        `candidate` is stored when there is none yet (the first caller's wins)."""

    async def reserve_file_counter(self, key: str, floor: int, count: int) -> int:
        """Reserve `count` output name counters for `key` (a folder and file name prefix,
        the same on every gateway); returns the first, never below `floor` (one past the
        highest this gateway's folder holds), never one handed out before."""

    async def orphaned(self) -> list[Job]:
        """Jobs whose owner's lease has run out (or that have no owner): running ones, in
        start order, and pending ones set aside for a lane (a reservation, which
        `unreserve` gives back). None of them is another live gateway's."""

    async def requeue_orphaned(self, job: Job) -> bool:
        """Put an orphaned job back to pending (its run died with its gateway), fenced:
        False when it is no longer running at `job.attempt` or no longer orphaned."""

    async def adopt(self, job: Job) -> Job | None:
        """Make an orphaned job this gateway's to follow where it runs (a backend): owner,
        and attempt + 1 so the old owner's writes are refused. None when it is no longer
        orphaned at `job.attempt`. The attempt note says it was adopted, not failed."""

    async def watch_work(self, wake: WorkWake) -> None:
        """Call `wake(owner, key)` on the event loop whenever a job becomes claimable in
        the store (queued, re-queued, given back), `owner` being the gateway that did it
        and `key` the job's `dispatch_key` when the store tells it (None: one or more
        jobs, place unknown): in-process with SQLite, by LISTEN/NOTIFY with PostgreSQL."""


class BackendOwners(Protocol):
    """Each ComfyUI backend is dispatched by one gateway at a time: the one whose name
    its row holds, while that gateway's lease (`GatewayLeases`) holds. No heartbeat of
    its own: once a gateway's lease runs out, its backends are free with its jobs."""

    async def claim_backends(
        self, offered: Mapping[str, str], limit: int | None = None, *, take_lapsed: bool = True
    ) -> list[BackendOwner]:
        """Take for this gateway, in the order of `offered` (backend name -> the client
        id it gets if the store has none for it yet), the backends no live gateway owns,
        at most `limit` of them (None: every one). Atomic: two gateways never both get
        one. Fenced: nothing is taken while this gateway's own lease is out. With
        `take_lapsed` false, only backends no gateway owns (never claimed, or released)
        are taken, not those of a gateway whose lease ran out: it may be alive and about
        to renew (see scheduler/lease.py). Returns every offered backend this gateway
        owns afterwards, with its client id."""

    async def release_backends(self, names: Sequence[str] | None = None) -> None:
        """Give up this gateway's ownership of `names` (None: all of them); their rows
        and client ids stay for the next owner."""

    async def backend_owners(self) -> list[BackendOwner]:
        """Every backend ever claimed, by name; `owner` is None when it is free."""


class RemoteJobJournal(Protocol):
    """Where paid remote jobs are recorded, so none is lost or paid for twice.

    A job is recorded before its job-creating request is sent, gets the
    provider's id right after, and ends once: a final state is never changed.
    Each job has an owner (`owner`, the gateway that sends and polls it) and a
    request hash has at most one live job: a gateway that wants a request another
    has in flight waits on that job through the store (single flight across
    gateways). Writes about a job are its owner's: another gateway's are refused.
    """

    #: The gateway this journal writes for.
    owner: str

    async def record_remote_job(self, job: NewRemoteJob) -> RemoteJob:
        """Durably record a job as `submitting`, owned by `owner`; raises StoreError if
        the id exists. When a live job with the same request hash exists, nothing is
        written and that job is returned instead (its id is not `job.id`)."""

    async def remote_job_submitted(
        self, job_id: str, remote_id: str, resume: dict[str, Any]
    ) -> bool:
        """The provider's id for the job, which is now `running`; `resume` replaces the
        stored one. False, and nothing written, when the job is unknown, final or not
        `owner`'s."""

    async def finish_remote_job(
        self,
        job_id: str,
        state: RemoteJobState,
        *,
        result: bytes | None = None,
        result_type: str | None = None,
        error: dict[str, Any] | None = None,
        attempts: int | None = None,
    ) -> bool:
        """Record how a job ended (`state` must be final; a result goes with SUCCEEDED).
        False, and nothing written, when the job is unknown, already final or not
        `owner`'s. Those who waited on it stop waiting (see `wait_on_remote_job`)."""

    async def assign_remote_slots(self, slots: Sequence[tuple[str, int]]) -> None:
        """Note which collector slot each job (by id) feeds; unknown ids are ignored."""

    async def remote_job(self, job_id: str) -> RemoteJob | None:
        """One job, with its result."""

    async def reusable_remote_job(self, request_hash: str) -> RemoteJob | None:
        """For a request about to be sent: the newest succeeded job with this hash (with
        its result), else the newest job with this hash in any state, else None."""

    async def live_remote_jobs(self) -> list[RemoteJob]:
        """Jobs not final yet that are `owner`'s or orphaned (their owner holds no lease),
        oldest first, without results: those this gateway may re-attach. Another live
        gateway's jobs are left out."""

    async def adopt_remote_job(self, job_id: str) -> RemoteJob | None:
        """Make a live job `owner`'s when it is already, or its owner holds no lease (it
        died): from then on that owner's writes are refused. The job, without its
        result; None when it is final, unknown or a live gateway's."""

    async def wait_on_remote_job(self, job_id: str, waiting: bool) -> None:
        """Note (or, `waiting` False, forget) that `owner` waits on another gateway's
        job, so its owner hands it over rather than cancel it (`release_remote_job`)."""

    async def release_remote_job(self, job_id: str) -> bool:
        """`owner` no longer wants its live job. True when nobody else waits on it: the
        caller cancels it at the provider, then finishes it. False when it was handed to
        a live gateway that waits on it (now its owner), or it is not `owner`'s or not
        live: the caller leaves it alone."""

    async def prune_remote_jobs(self, finished_before: float) -> int:
        """Delete final jobs that finished before this time; returns how many went."""


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


class PromptEventLog(Protocol):
    """Each prompt's client stream, kept for followers that arrive late or come back.

    Ids grow with every append, store-wide, and are never reused. One appender at a time
    per prompt (the process running it), so a prompt's events are read back in the order
    they were appended and a reader resuming after an id misses none of them.
    """

    async def append_prompt_events(self, events: Sequence[NewPromptEvent]) -> list[PromptEvent]:
        """Commit these events in one transaction, in the order given; returns them with
        their ids (growing in that order) and the time they were appended."""

    async def prompt_events(
        self, prompt_id: str, after: int = 0, limit: int = 500
    ) -> list[PromptEvent]:
        """At most `limit` events of one prompt with an id above `after`, oldest first,
        binary frames included: a page ends early after the event whose frame brings its
        frame bytes to PAGE_FRAME_BYTES (prompt_events.more_after tells a full page)."""

    async def prune_prompt_events(self, ended_before: float) -> int:
        """Delete every event of each prompt whose newest event was appended before this
        time and whose job is not pending or running (gone jobs included); returns how
        many events went."""

    async def watch_events(self, wake: Callable[[EventsAppended], None]) -> None:
        """Call `wake` on the event loop once for each prompt of every committed append,
        by any process sharing the store: in-process with SQLite (after the commit), by
        LISTEN/NOTIFY with PostgreSQL (notified in the appending transaction). A listener
        that lost its connection reconnects, then wakes each prompt appended to since a
        little before the loss (and `EventsAppended(None, ...)` when there are too many):
        nothing committed goes unannounced."""


class JobStore(
    GatewayLeases, BackendOwners, RemoteJobJournal, WebhookOutbox, PromptEventLog, Protocol
):
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
        self, job: NewJob, claim_for: str | None = None, *, max_pending: int | None = None
    ) -> Job:
        """Durably queue a job as pending; raises StoreError if the id exists.

        With `claim_for`, that lane takes the job in the same transaction (running,
        attempt 1): a hand-off to an idle slot while nothing else is pending.

        With `max_pending`, a pending job is queued only while fewer than that many
        jobs are pending in the store, whoever queued them: PendingLimitReached, and
        nothing written, otherwise. Every process sharing the store is counted, and two
        submits at once never both take the last place.

        With `job.idempotency`, its key is recorded for the job's tenant in the same
        transaction; when the tenant used the key less than IDEMPOTENCY_WINDOW ago,
        nothing is written and IdempotencyKeyTaken carries the first request."""

    async def idempotent_request(self, tenant: str, key: str) -> IdempotentRequest | None:
        """The first submit under `tenant`'s `key`, if recorded less than
        IDEMPOTENCY_WINDOW ago (by the store's clock); None once the key is free."""

    async def candidates(self, limit: int, after: Job | None = None) -> list[Job]:
        """Claimable jobs (pending, set aside for no lane) in dispatch order: at most
        `limit` (clamped to 1..MAX_CANDIDATES), those past `after` (the last job of an
        earlier page) when given. A read: nothing is taken, no lock is held. The caller
        chooses among them and takes one with `claim_job` or `reserve_job`."""

    async def claim_job(self, job: Job, lane: str) -> Job | None:
        """Start a candidate on `lane`: running, attempt + 1, this gateway's (`owner`).
        Fenced: None, and nothing written, when the job is no longer claimable at
        `job.attempt` (claimed, reserved, cancelled or re-queued meanwhile)."""

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
        or the job is not running. `result.status` must be terminal; only HISTORIC
        statuses make a history entry (CANCELLED records the rest, no entry)."""

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

    # -- jobs and history ----------------------------------------------------

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

    async def history(
        self, max_items: int | None = None, offset: int | None = None, *, tenant: str | None = None
    ) -> list[HistoryEntry]:
        """Entries in completion order, paged as ComfyUI does: without offset (or
        with a negative one), the newest `max_items`, oldest first; with offset,
        skip `offset` from the oldest, then at most `max_items`. None: no limit.
        `max_items` <= 0 gives nothing. With `tenant`, only that tenant's entries
        (paged among themselves)."""

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None: ...

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """Remove these history entries (unknown ids are ignored). The jobs stay, with
        their output records, until pruned."""

    async def clear_history(self, *, tenant: str | None = None) -> None:
        """Remove every history entry (only `tenant`'s when one is named); the jobs stay,
        as with `delete_history`."""

    async def prune_history(
        self, *, max_entries: int | None, max_age_seconds: float | None
    ) -> list[OutputFile]:
        """Delete the oldest history entries beyond `max_entries` and those older than
        `max_age_seconds`, with their jobs, events and output records. Finished jobs
        without an entry (cancelled, or entry deleted) go too once they finished
        before the cutoff or before the newest entry dropped. Returns the output
        files of everything deleted, oldest first (the caller deletes them from
        disk), each with its job's tenant. Pending and running jobs are never pruned."""

    async def listed_outputs(self, files: Sequence[OutputFile]) -> set[OutputFile]:
        """Those of `files` that a job in the store still lists among its output files
        (same tenant, type, subfolder and name): the others' history entries are gone."""

    # -- fleet -----------------------------------------------------------------------

    async def backends(self) -> list[dict[str, Any]]:
        """Backend specs added at run time, in the order they were added."""

    async def save_backend(self, name: str, spec: dict[str, Any]) -> None:
        """Add or replace a backend spec."""

    async def delete_backend(self, name: str) -> bool:
        """Forget a backend (and its owner: see `BackendOwners`); False when it was not there."""
