"""The SQLite job store: one file in WAL mode, async-only, durable at every await.

Writes go through one writer thread that commits queued operations in groups
(see `sqlite_parts/io.py`, GroupWriter); reads run on a small pool of reader threads.
Each public coroutine returns once its change is committed (or its read done);
the event loop never waits on SQLite itself.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import math
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from comfyfleet.domain.idempotency import IdempotencyKeyTaken, IdempotentRequest
from comfyfleet.domain.jobs import (
    TERMINAL,
    HistoryEntry,
    Job,
    JobResult,
    JobStatus,
    NewJob,
    OutputFile,
    order_key,
)
from comfyfleet.domain.webhooks import (
    EVENT_OF,
    WebhookEvent,
)
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_large
from comfyfleet.store.base import (
    DuplicateJob,
    PendingLimitReached,
    QueuedLimitReached,
    StoreError,
    WorkWake,
    clamp_candidates,
)
from comfyfleet.store.commit_times import CommitTimes
from comfyfleet.store.event_wakeups import EventsWake
from comfyfleet.store.pending_json import PendingJson
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts import event_log_sql as event_log
from comfyfleet.store.sqlite_parts import idempotency_sql as idempotency
from comfyfleet.store.sqlite_parts import journal_sql as journal
from comfyfleet.store.sqlite_parts import leases_sql as leases
from comfyfleet.store.sqlite_parts import schema as schema
from comfyfleet.store.sqlite_parts import webhooks_sql as webhooks
from comfyfleet.store.sqlite_parts.assets import SQLiteAssets
from comfyfleet.store.sqlite_parts.backends import SQLiteBackends
from comfyfleet.store.sqlite_parts.event_log import SQLiteEventLog
from comfyfleet.store.sqlite_parts.gateways import SQLiteGateways
from comfyfleet.store.sqlite_parts.io import GroupWriter, ReaderPool, WriterStats
from comfyfleet.store.sqlite_parts.journal import SQLiteJournal
from comfyfleet.store.sqlite_parts.published_nodes import SQLitePublishedNodes
from comfyfleet.store.sqlite_parts.queue_reads import SQLiteQueueReads
from comfyfleet.store.sqlite_parts.webhooks import SQLiteWebhookOutbox

Q = load_blocks("sqlite_queries.sql")

T = TypeVar("T")

#: The version sqlite_schema.sql's migrations reach; PRAGMA user_version holds a file's version.
SCHEMA_VERSION = 19


def _add_tenants(conn: sqlite3.Connection) -> None:
    """Jobs get their tenant; those from before belong to `default` (see comfyfleet.tenants),
    which keeps the data dir's own folders, so their outputs stay where they are."""
    if not schema.has_column(conn, "jobs", "tenant"):
        conn.execute("ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'")
    schema.apply(conn, 4)


#: Upgrades of a file: MIGRATIONS[n] takes a version n-1 file to version n (a fresh file
#: is version 0 and takes every one). Each runs inside the opening transaction, so a
#: failed upgrade leaves the file as it was.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: functools.partial(schema.apply, version=1),  # jobs, history, events, outputs, meta
    2: functools.partial(schema.apply, version=2),  # backends added at run time
    3: functools.partial(schema.apply, version=3),  # the remote-job journal
    4: _add_tenants,
    5: leases.migrate,  # job owners and gateway leases
    6: functools.partial(schema.apply, version=6),  # Idempotency-Key submits
    7: functools.partial(schema.apply, version=7),  # the webhook outbox
    8: functools.partial(schema.apply, version=8),  # the prompt event log
    9: functools.partial(schema.apply, version=9),  # which gateway dispatches to each backend
    10: journal.migrate_owners,  # remote-job owners: one journal for every gateway
    11: functools.partial(schema.apply, version=11),  # keys the gateways agree on
    12: event_log.add_frames,  # binary frames in the event log
    13: functools.partial(schema.apply, version=13),  # output name counters
    14: functools.partial(schema.apply, version=14),  # Comfy API v2 assets
    15: functools.partial(schema.apply, version=15),  # each tenant's queue, for fair share
    16: journal.add_budget_columns,  # remote jobs' tenant, model and cost (budgets)
    17: functools.partial(schema.apply, version=17),  # budgets held for backends' prompts
    18: functools.partial(schema.apply, version=18),  # claims read past no reserved job
    19: functools.partial(schema.apply, version=19),  # nodes of lanes one gateway reaches
}

SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})

#: Ids bound per `IN (...)` query; well under SQLite's variable limit.
CHUNK = 500

_JOB_FIELDS = (
    "prompt_id",
    "number_json",
    "front",
    "seq",
    "prompt",
    "extra_data",
    "outputs",
    "client_id",
    "status",
    "attempt",
    "lane",
    "created_at",
    "started_at",
    "finished_at",
    "error",
    "tenant",
    "owner",
)
JOB_COLUMNS = ", ".join(_JOB_FIELDS)

ORPHANED = Q["orphaned"]

# -- write statements -----------------------------------------------------------

COUNT_PENDING = Q["count_pending"]
COUNT_PENDING_OF = Q["count_pending_of"]

INSERT_JOB = Q["insert_job"]
CLAIM_JOB = Q["claim_job"]
CLAIM_CANDIDATE = Q["claim_candidate"]
CLAIM_CANDIDATE_CAPPED = Q["claim_candidate_capped"]
RESERVE_CANDIDATE = Q["reserve_candidate"]
START_RESERVED = Q["start_reserved"]
UNRESERVE_JOB = Q["unreserve_job"]
FINISH_JOB = Q["finish_job"]
INSERT_HISTORY = Q["insert_history"]
INSERT_EVENT = Q["insert_event"]
INSERT_OUTPUT = Q["insert_output"]
ATTEMPT_NOTES_OF = Q["attempt_notes_of"]
REQUEUE_JOB = Q["requeue_job"]
REQUEUE_LANE = Q["requeue_lane"]
CANCEL_JOB = Q["cancel_job"]
CANCEL_PENDING_JOB = Q["cancel_pending_job"]
CANCEL_PENDING = Q["cancel_pending"]
DELETE_HISTORY = Q["delete_history"]
CLEAR_HISTORY = Q["clear_history"]
DELETE_JOB = Q["delete_job"]
SAVE_NUMBER_FLOOR = Q["save_number_floor"]

# -- read statements --------------------------------------------------------------
# INDEXED BY pins the partial indexes: without statistics the planner would rather
# take jobs_status and sort, and the queue must stay an in-order index walk.

SELECT_JOB = Q["select_job"]
SELECT_PENDING = Q["select_pending"]
SELECT_CLAIMABLE = Q["select_claimable"]
SELECT_CLAIMABLE_AFTER = Q["select_claimable_after"]
SELECT_CLAIMABLE_OF = Q["select_claimable_of"]
SELECT_CLAIMABLE_OF_AFTER = Q["select_claimable_of_after"]
SELECT_RUNNING = Q["select_running"]
COUNT_STATUSES = Q["count_statuses"]
HISTORY_OLDEST_FIRST = Q["history_oldest_first"]
HISTORY_NEWEST_FIRST = Q["history_newest_first"]
HISTORY_ONE = Q["history_one"]
EVENTS_OF = Q["events_of"]
OUTPUTS_OF = Q["outputs_of"]
MAX_COUNTED_NUMBER = Q["max_counted_number"]
SELECT_NUMBER_FLOOR = Q["select_number_floor"]
HISTORY_AT_RANK = Q["history_at_rank"]
HISTORY_BEFORE = Q["history_before"]
UNLISTED_BEFORE = Q["unlisted_before"]

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


class SQLiteStore(
    SQLiteAssets,
    SQLiteBackends,
    SQLiteJournal,
    SQLiteWebhookOutbox,
    SQLiteEventLog,
    SQLiteGateways,
    SQLitePublishedNodes,
    SQLiteQueueReads,
):
    """A `JobStore` in one SQLite file.

    `synchronous` is SQLite's durability setting: FULL (the default) survives
    power loss; NORMAL survives a killed process but may lose the last commits
    on power loss, for fewer fsyncs. `max_batch` bounds how many queued writes
    share one transaction (1 turns group commit off). `clock` gives the
    timestamps the store records. `owner` is the gateway it claims for (a fresh id
    when not given).
    """

    #: One gateway's file: its own count of pending jobs is the whole queue.
    shared = False

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "FULL",
        max_batch: int = 256,
        readers: int = 2,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {sorted(SYNCHRONOUS_MODES)}")
        self.path = Path(path)
        self._synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._reader_count = readers
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._writer: GroupWriter | None = None
        self._stats = WriterStats()
        #: Every group commit's time (the writer adds; metrics read).
        self.commit_times = CommitTimes()
        self._readers: ReaderPool | None = None
        self._pending = PendingJson()
        self._number = 0
        self.owner = owner or f"gateway-{uuid.uuid4().hex[:12]}"
        self._instance = uuid.uuid4().hex
        self._wakes: list[WorkWake] = []
        self._event_wakes: list[EventsWake] = []

    @property
    def stats(self) -> WriterStats:
        """Writer counters (transactions, operations, retries), for tests and benchmarks."""
        return self._stats

    # -- lifecycle ----------------------------------------------------------------

    async def open(self) -> None:
        """Open (creating or migrating) the file; ready for use afterwards."""
        if self._writer is not None:
            raise StoreError("the store is already open")
        writer = GroupWriter(self._connect_writer, self._max_batch, self.commit_times)
        try:
            self._number = await writer.submit(_prepare)
        except BaseException:
            await writer.close()
            raise
        self._writer = writer
        self._stats = writer.stats
        self._readers = ReaderPool(self._connect_reader, self._reader_count)

    async def close(self) -> None:
        """Commit queued writes, remember the counter, release threads and connections."""
        writer, readers = self._writer, self._readers
        if writer is None or readers is None:
            return
        self._writer = self._readers = None
        try:
            await writer.submit(functools.partial(_save_number_floor, number=self._number))
        finally:
            await writer.close()
            await readers.close()

    def _connect_writer(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{self.path}: WAL mode unavailable (journal mode {mode})")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        # check_same_thread=False only so ReaderPool can close it from another thread
        # after its own thread has ended; it is never used by two threads at once.
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=self._busy_timeout, check_same_thread=False
        )
        conn.execute("PRAGMA query_only = ON")
        return conn

    # -- queue --------------------------------------------------------------------

    async def submit(
        self,
        job: NewJob,
        claim_for: str | None = None,
        *,
        max_pending: int | None = None,
        max_queued: int | None = None,
    ) -> Job:
        """Durably queue a job as pending (or, with `claim_for`, as already claimed by
        that lane); StoreError if the id exists, IdempotencyKeyTaken if the job's key is,
        QueuedLimitReached or PendingLimitReached past `max_queued` or `max_pending`."""
        now = self._clock()
        if job.number is None:  # counted: the counter's next value
            job = job.numbered(await self.next_number())
        if is_large(job.prompt):
            params = await asyncio.to_thread(_job_params, job, now)
        else:
            params = _job_params(job, now)
        if isinstance(job.number, int) and not isinstance(job.number, bool):
            # A counter value from elsewhere (e.g. an import) keeps the counter ahead of it.
            self._number = max(self._number, abs(job.number) + 1)
        op = functools.partial(
            _insert_job,
            params=params,
            claim=claim_for,
            now=now,
            owner=self.owner,
            keyed=job.idempotency,
            limits=(None, None) if claim_for is not None else (max_queued, max_pending),
        )
        seq = await self._write(op)
        if isinstance(seq, IdempotentRequest):
            raise IdempotencyKeyTaken(seq)
        if isinstance(seq, _Refused):
            raise seq.error(max_queued, max_pending)
        queued = job.pending(seq, now)
        if claim_for is None:
            self._work_arrived()
            return queued
        return queued.started(claim_for, 1, now, self.owner)

    async def idempotent_request(self, tenant: str, key: str) -> IdempotentRequest | None:
        """The first submit under `tenant`'s `key`, if it was less than a window ago."""
        op = functools.partial(idempotency.first, tenant=tenant, key=key, now=self._clock())
        return await self._read(op)

    async def candidates(
        self, limit: int, after: Job | None = None, tenant: str | None = None
    ) -> list[Job]:
        """Claimable jobs in dispatch order, `limit` at most, past `after` when given,
        only `tenant`'s when given."""
        limit = clamp_candidates(limit)
        op = functools.partial(
            _candidates, limit=limit, after=after, tenant=tenant, pending=self._pending
        )
        return await self._read(op)

    async def claim_job(self, job: Job, lane: str, running_cap: int | None = None) -> Job | None:
        """Start a candidate on `lane`; None when it is no longer claimable so (or its
        tenant runs `running_cap` jobs already)."""
        now = self._clock()
        params: tuple[object, ...] = (lane, now, self.owner, job.prompt_id, job.attempt)
        query = CLAIM_CANDIDATE
        if running_cap is not None:
            query, params = CLAIM_CANDIDATE_CAPPED, (*params, running_cap)
        if not await self._write(lambda conn: conn.execute(query, params).rowcount):
            return None
        self._pending.taken(job.prompt_id)
        return job.started(lane, job.attempt + 1, now, self.owner)

    async def reserve_job(self, job: Job, lane: str) -> Job | None:
        """Set a candidate aside for `lane`: it stays pending (listed, cancellable) but
        claims skip it. None when it is no longer claimable so."""
        params = (lane, self.owner, job.prompt_id, job.attempt)
        if not await self._write(lambda conn: conn.execute(RESERVE_CANDIDATE, params).rowcount):
            return None
        return replace(job, lane=lane, owner=self.owner)

    async def start_reserved(self, job: Job, lane: str) -> Job | None:
        """Run a job reserved for `job.lane` (or, with `job.lane` None, a pending job set
        aside for no lane) on `lane` (running, attempt + 1); None when it is no longer
        pending so (cancelled, claimed, or given back meanwhile)."""
        now = self._clock()
        op = functools.partial(_start_reserved, job=job, lane=lane, now=now, owner=self.owner)
        if not await self._write(op):
            return None
        self._pending.taken(job.prompt_id)
        return job.started(lane, job.attempt + 1, now, self.owner)

    async def unreserve(self, prompt_ids: Sequence[str]) -> None:
        """Give reserved jobs back to the queue (claims see them again)."""
        ids = list(prompt_ids)
        if ids:
            await self._write(lambda conn: conn.executemany(UNRESERVE_JOB, [(i,) for i in ids]))
            self._work_arrived()

    async def finish(self, prompt_id: str, attempt: int, result: JobResult) -> bool:
        """Record how an attempt ended, in one transaction; False if the attempt is stale."""
        if result.status not in TERMINAL:
            raise ValueError(f"a finished attempt needs a terminal status, not {result.status}")
        op = functools.partial(
            _finish,
            prompt_id=prompt_id,
            attempt=attempt,
            result=_ResultParams(result),
            now=self._clock(),
        )
        return await self._write(op)

    async def requeue(
        self, prompt_id: str, attempt: int, reason: dict[str, Any] | None = None
    ) -> bool:
        """Put a running attempt back to pending; False if the attempt is stale.

        A `reason` is kept with the attempt (see `attempt_notes`)."""
        op = functools.partial(_requeue, prompt_id=prompt_id, attempt=attempt, reason=reason)
        if not await self._write(op):
            return False
        self._work_arrived()
        return True

    async def attempt_notes(self, prompt_id: str) -> list[tuple[int, dict[str, Any]]]:
        """The reasons earlier attempts were given back, oldest first."""
        return (await self.attempt_notes_of([prompt_id])).get(prompt_id, [])

    async def attempt_notes_of(
        self, prompt_ids: Sequence[str]
    ) -> dict[str, list[tuple[int, dict[str, Any]]]]:
        """The reasons of many jobs in one read (e.g. every re-queued job at start)."""
        return await self._read(functools.partial(_attempt_notes_of, ids=list(prompt_ids)))

    async def requeue_lane(self, lane_prefix: str) -> list[str]:
        """Put every job running on a lane named `lane_prefix*` back to pending."""
        op = functools.partial(
            _requeue_lane, prefix=lane_prefix, owner=self.owner, now=self._clock()
        )
        requeued = await self._write(op)
        if requeued:
            self._work_arrived()
        return requeued

    async def cancel(self, prompt_ids: Sequence[str], *, pending_only: bool) -> list[str]:
        """Cancel pending (and, unless `pending_only`, running) jobs; returns the changed ids."""
        ids = list(dict.fromkeys(prompt_ids))
        op = functools.partial(_cancel, ids=ids, pending_only=pending_only, now=self._clock())
        return await self._write(op)

    async def cancel_all_pending(self) -> list[str]:
        """Cancel every pending job; returns their ids in submission order."""
        return await self._write(functools.partial(_cancel_pending, now=self._clock()))

    async def queue(self, *, tenant: str | None = None) -> tuple[list[Job], list[Job]]:
        """(running by start time, pending in dispatch order), from one snapshot; only
        the jobs of `tenant` when one is named."""
        if tenant is not None:
            return await self._read(functools.partial(_tenant_queue, tenant=tenant))
        return await self._read(_queue)

    async def active_count(self, tenant: str) -> int:
        """How many jobs of `tenant` are pending or running."""
        return await self._read(functools.partial(_active_count, tenant=tenant))

    async def owned(self, prompt_ids: Sequence[str], tenant: str) -> list[str]:
        """The ids among `prompt_ids` whose job belongs to `tenant`, in the order given."""
        ids = list(dict.fromkeys(prompt_ids))
        mine = await self._read(functools.partial(_owned, ids=ids, tenant=tenant))
        return [prompt_id for prompt_id in ids if prompt_id in mine]

    async def counts(self) -> dict[JobStatus, int]:
        """Jobs per status; every status is present."""
        return await self._read(_counts)

    async def ping(self) -> None:
        await self._read(lambda conn: conn.execute(Q["ping"]).fetchone())

    async def next_number(self) -> int:
        """The next value of ComfyUI's submission counter (advances on every call)."""
        number = self._number
        self._number += 1
        return number

    async def orphaned(self) -> list[Job]:
        now = self._clock()
        return await self._read(lambda conn: [_job(row) for row in conn.execute(ORPHANED, (now,))])

    async def requeue_orphaned(self, job: Job) -> bool:
        params = (job.prompt_id, job.attempt, self._clock())
        changed = await self._write(
            lambda conn: conn.execute(leases.REQUEUE_ORPHANED, params).rowcount == 1
        )
        if changed:
            self._work_arrived()
        return changed

    async def adopt(self, job: Job) -> Job | None:
        note = _dumps({"kind": "adopted", "from": job.owner})
        op = functools.partial(
            leases.adopt,
            owner=self.owner,
            prompt_id=job.prompt_id,
            attempt=job.attempt,
            now=self._clock(),
            note=note,
        )
        if not await self._write(op):
            return None
        return replace(job, attempt=job.attempt + 1, owner=self.owner)

    async def watch_work(self, wake: WorkWake) -> None:
        """In-process: one SQLite file has one gateway, so every wake-up is its own (and
        says no place: the scheduler knows it already)."""
        self._wakes.append(wake)

    def _work_arrived(self) -> None:
        for wake in self._wakes:
            wake(self.owner, None)

    # -- jobs and history ---------------------------------------------------------

    async def get(self, prompt_id: str) -> Job | None:
        """The job with this id, if the store has it."""
        return await self._read(functools.partial(_get, prompt_id=prompt_id))

    async def jobs(
        self,
        *,
        statuses: Sequence[JobStatus] | None = None,
        newest_first: bool = True,
        limit: int | None = None,
        offset: int = 0,
        tenant: str | None = None,
    ) -> tuple[list[Job], int]:
        """A page of jobs by creation time (ties by submission order), and the total;
        only `tenant`'s jobs when one is named."""
        op = functools.partial(
            _jobs,
            statuses=None if statuses is None else sorted(set(statuses)),
            newest_first=newest_first,
            limit=limit,
            offset=max(0, offset),
            tenant=tenant,
        )
        return await self._read(op)

    async def history(
        self, max_items: int | None = None, offset: int | None = None, *, tenant: str | None = None
    ) -> list[HistoryEntry]:
        """History entries in completion order, paged as ComfyUI does (see JobStore); only
        `tenant`'s entries when one is named."""
        if max_items is not None and max_items <= 0:
            return []
        if tenant is not None:
            scoped = functools.partial(
                _tenant_history, max_items=max_items, offset=offset, tenant=tenant
            )
            return await self._read(scoped)
        op = functools.partial(_history, max_items=max_items, offset=offset)
        return await self._read(op)

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None:
        """One history entry, or None."""
        return await self._read(functools.partial(_history_entry, prompt_id=prompt_id))

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """Remove these entries from the history; the jobs themselves stay."""
        ids = list(dict.fromkeys(prompt_ids))
        await self._write(functools.partial(_delete_history, ids=ids))

    async def clear_history(self, *, tenant: str | None = None) -> None:
        """Remove every history entry (of `tenant`, when one is named); the jobs stay."""
        if tenant is not None:
            await self._write(functools.partial(_clear_tenant_history, tenant=tenant))
            return
        await self._write(_clear_history)

    async def prune_history(
        self, *, max_entries: int | None, max_age_seconds: float | None
    ) -> list[OutputFile]:
        """Delete the oldest finished jobs beyond the limits (see JobStore); returns their files."""
        if max_entries is None and max_age_seconds is None:
            return []
        cutoff = -math.inf if max_age_seconds is None else self._clock() - max_age_seconds
        op = functools.partial(_prune, max_entries=max_entries, cutoff=cutoff, number=self._number)
        return await self._write(op)

    async def listed_outputs(self, files: Sequence[OutputFile]) -> set[OutputFile]:
        """Those of `files` a job still lists (see JobStore)."""
        return await self._read(functools.partial(_listed_outputs, files=list(files)))


# -- encoding -----------------------------------------------------------------------


def _job_params(job: NewJob, now: float) -> tuple[Any, ...]:
    """Encode on the caller's thread: bad JSON fails there, and the writer stays busy
    only with SQL."""
    assert job.number is not None  # a counted job was numbered by `submit`
    return (
        job.prompt_id,
        _dumps(job.number),
        order_key(job.front, job.number),  # never NaN: SQLite would store it as NULL
        int(job.front),
        job.client_id,
        _dumps(job.prompt),
        _dumps(job.extra_data),
        _dumps(job.outputs),
        _dumps(job.node_errors),
        now,
        job.tenant,
    )


class _ResultParams:
    """A JobResult encoded for the finish transaction."""

    def __init__(self, result: JobResult) -> None:
        self.status = result.status.value
        self.event = EVENT_OF[result.status]
        self.historic = result.historic
        self.error = None if result.error is None else _dumps(result.error)
        self.outputs = _dumps(result.outputs)
        self.meta = _dumps(result.meta)
        self.events = [
            (i, str(kind), _dumps(data)) for i, (kind, data) in enumerate(result.messages)
        ]
        self.files = [(f.filename, f.subfolder, f.type) for f in result.files]


def _job(row: Sequence[Any], pending: PendingJson | None = None) -> Job:
    """A job from its row; `pending` keeps the decoded JSON of jobs read while pending."""
    texts = (row[4], row[5], row[6])
    if pending is None:
        prompt, extra_data, outputs = (_loads(text) for text in texts)
    else:
        prompt, extra_data, outputs = pending.decode(row[0], texts)
    return Job(
        prompt_id=row[0],
        number=_loads(row[1]),
        front=bool(row[2]),
        seq=row[3],
        prompt=prompt,
        extra_data=extra_data,
        outputs=outputs,
        client_id=row[7],
        status=JobStatus(row[8]),
        attempt=row[9],
        lane=row[10],
        created_at=row[11],
        started_at=row[12],
        finished_at=row[13],
        error=None if row[14] is None else _loads(row[14]),
        tenant=row[15],
        owner=row[16],
    )


def _marks(count: int) -> str:
    return ", ".join("?" * count)


def _chunks(items: Sequence[str], size: int = CHUNK) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- writer-thread operations ---------------------------------------------------------


def _prepare(conn: sqlite3.Connection) -> int:
    """Create or migrate the schema; returns where the submission counter resumes."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"the store file has schema version {version}, newer than this program")
    for target in range(version + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[target](conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    counted = conn.execute(MAX_COUNTED_NUMBER).fetchone()[0]
    floor_row = conn.execute(SELECT_NUMBER_FLOOR).fetchone()
    floor = int(floor_row[0]) if floor_row else 0
    # A fresh store starts at 0, like a fresh ComfyUI.
    return max(floor, 0 if counted is None else int(counted) + 1)


def _save_number_floor(conn: sqlite3.Connection, number: int) -> None:
    conn.execute(SAVE_NUMBER_FLOOR, (number,))


class _Refused(enum.Enum):
    """Which limit refused a submit."""

    TENANT_FULL = "max_queued"
    QUEUE_FULL = "max_pending"

    def error(self, max_queued: int | None, max_pending: int | None) -> ComfyfleetError:
        if self is _Refused.TENANT_FULL:
            return QueuedLimitReached(max_queued or 0)
        return PendingLimitReached(max_pending or 0)


def _insert_job(
    conn: sqlite3.Connection,
    params: tuple[Any, ...],
    claim: str | None,
    now: float,
    owner: str,
    keyed: IdempotentRequest | None,
    limits: tuple[int | None, int | None],
) -> int | IdempotentRequest | _Refused:
    """The job's seq; with `keyed`, its key recorded first, or (nothing written) the key's
    first request when another job holds it. `limits` is (the tenant's cap, the pending
    limit), each None for none; a refusal (nothing written) names the limit reached."""
    # The transaction holds the file's write lock (BEGIN IMMEDIATE) from before these
    # counts to the commit: no other submit, of any process, lands in between.
    tenant_cap, limit = limits
    if tenant_cap is not None:
        queued: int = conn.execute(COUNT_PENDING_OF, (params[-1],)).fetchone()[0]
        if queued >= tenant_cap:
            return _Refused.TENANT_FULL
    if limit is not None and conn.execute(COUNT_PENDING).fetchone()[0] >= limit:
        return _Refused.QUEUE_FULL
    if keyed is not None:
        first = idempotency.claim(conn, params[-1], keyed, params[0], now)
        if first is not None:
            return first
    try:
        seq: int = conn.execute(INSERT_JOB, params).fetchone()[0]
    except sqlite3.IntegrityError as exc:
        raise DuplicateJob(f"prompt {params[0]!r} already exists") from exc
    if claim is not None:
        conn.execute(CLAIM_JOB, (claim, now, owner, params[0]))
    return seq


def _candidates(
    conn: sqlite3.Connection,
    limit: int,
    after: Job | None,
    tenant: str | None,
    pending: PendingJson,
) -> list[Job]:
    of: tuple[str, ...] = () if tenant is None else (tenant,)
    if after is None:
        query = SELECT_CLAIMABLE if tenant is None else SELECT_CLAIMABLE_OF
        rows = conn.execute(query, (*of, limit))
    else:
        front, key, seq = int(after.front), order_key(after.front, after.number), after.seq
        query = SELECT_CLAIMABLE_AFTER if tenant is None else SELECT_CLAIMABLE_OF_AFTER
        rows = conn.execute(query, (*of, front, front, key, key, seq, limit))
    return [_job(row, pending) for row in rows]


def _start_reserved(conn: sqlite3.Connection, job: Job, lane: str, now: float, owner: str) -> bool:
    params = (lane, now, owner, job.prompt_id, job.lane)
    return conn.execute(START_RESERVED, params).rowcount == 1


def _finish(
    conn: sqlite3.Connection, prompt_id: str, attempt: int, result: _ResultParams, now: float
) -> bool:
    changed = conn.execute(
        FINISH_JOB, (result.status, now, result.error, prompt_id, attempt)
    ).rowcount
    if not changed:
        return False
    if result.historic:
        conn.execute(INSERT_HISTORY, (prompt_id, result.status, result.outputs, result.meta, now))
    conn.executemany(INSERT_EVENT, [(prompt_id, attempt, *event) for event in result.events])
    conn.executemany(INSERT_OUTPUT, [(prompt_id, *file) for file in result.files])
    webhooks.enqueue(conn, prompt_id, result.event, now)
    return True


def _requeue(
    conn: sqlite3.Connection, prompt_id: str, attempt: int, reason: dict[str, Any] | None
) -> bool:
    if conn.execute(REQUEUE_JOB, (prompt_id, attempt)).rowcount != 1:
        return False
    if reason is not None:
        conn.execute(INSERT_EVENT, (prompt_id, attempt, -1, "requeued", _dumps(reason)))
    return True


def _attempt_notes_of(
    conn: sqlite3.Connection, ids: Sequence[str]
) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for prompt_id, attempt, data in _rows_for(conn, ATTEMPT_NOTES_OF, ids):
        found.setdefault(prompt_id, []).append((attempt, json.loads(data)))
    return found


def _requeue_lane(conn: sqlite3.Connection, prefix: str, owner: str, now: float) -> list[str]:
    rows = conn.execute(REQUEUE_LANE, (len(prefix), prefix, owner, now)).fetchall()
    return [prompt_id for prompt_id, _ in sorted(rows, key=lambda row: row[1])]


def _cancel(conn: sqlite3.Connection, ids: list[str], pending_only: bool, now: float) -> list[str]:
    statement = CANCEL_PENDING_JOB if pending_only else CANCEL_JOB
    cancelled = [pid for pid in ids if conn.execute(statement, (now, pid)).rowcount]
    for prompt_id in cancelled:
        webhooks.enqueue(conn, prompt_id, WebhookEvent.CANCELLED, now)
    return cancelled


def _cancel_pending(conn: sqlite3.Connection, now: float) -> list[str]:
    rows = conn.execute(CANCEL_PENDING, (now,)).fetchall()
    cancelled = [prompt_id for prompt_id, _ in sorted(rows, key=lambda row: row[1])]
    for prompt_id in cancelled:
        webhooks.enqueue(conn, prompt_id, WebhookEvent.CANCELLED, now)
    return cancelled


def _delete_history(conn: sqlite3.Connection, ids: list[str]) -> None:
    conn.executemany(DELETE_HISTORY, [(prompt_id,) for prompt_id in ids])


def _clear_history(conn: sqlite3.Connection) -> None:
    conn.execute(CLEAR_HISTORY)


def _prune(
    conn: sqlite3.Connection, max_entries: int | None, cutoff: float, number: int
) -> list[OutputFile]:
    horizon_pos, horizon_time = 0, cutoff
    if max_entries is not None:
        row = conn.execute(HISTORY_AT_RANK, (max(0, max_entries),)).fetchone()
        if row is not None:
            horizon_pos, horizon_time = row[0], max(cutoff, math.nextafter(row[1], math.inf))
    victims = [r[0] for r in conn.execute(HISTORY_BEFORE, (horizon_pos, cutoff))]
    # Jobs with no entry (cancelled, or entry deleted) go once they are older than
    # the newest entry dropped, so they cannot pile up forever.
    victims += [r[0] for r in conn.execute(UNLISTED_BEFORE, (horizon_time,))]
    files = _files_of(conn, victims)
    tenants = _tenants_of(conn, victims)
    # Deleting jobs could lower max(number) below what was handed out.
    conn.execute(SAVE_NUMBER_FLOOR, (number,))
    conn.executemany(DELETE_JOB, [(prompt_id,) for prompt_id in victims])
    return [
        replace(file, tenant=tenants[prompt_id])
        for prompt_id in victims
        for file in files.get(prompt_id, [])
    ]


# -- reader-thread operations -----------------------------------------------------------


def _get(conn: sqlite3.Connection, prompt_id: str) -> Job | None:
    row = conn.execute(SELECT_JOB, (prompt_id,)).fetchone()
    return None if row is None else _job(row)


def _queue(conn: sqlite3.Connection) -> tuple[list[Job], list[Job]]:
    running = [_job(row) for row in conn.execute(SELECT_RUNNING)]
    pending = [_job(row) for row in conn.execute(SELECT_PENDING, (-1,))]
    return running, pending


def _counts(conn: sqlite3.Connection) -> dict[JobStatus, int]:
    counts = dict.fromkeys(JobStatus, 0)
    for status, count in conn.execute(COUNT_STATUSES):
        counts[JobStatus(status)] = count
    return counts


def _jobs(
    conn: sqlite3.Connection,
    statuses: list[JobStatus] | None,
    newest_first: bool,
    limit: int | None,
    offset: int,
    tenant: str | None = None,
) -> tuple[list[Job], int]:
    where, params = "", []
    if statuses is not None:
        where = f"WHERE status IN ({_marks(len(statuses))})"
        params = [status.value for status in statuses]
    if tenant is not None:
        where = f"{where} AND tenant = ?" if where else "WHERE tenant = ?"
        params.append(tenant)
    direction = "DESC" if newest_first else "ASC"
    page = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs {where} "
        f"ORDER BY created_at {direction}, seq {direction} LIMIT ? OFFSET ?",
        (*params, -1 if limit is None else max(0, limit), offset),
    )
    jobs = [_job(row) for row in page]
    total: int = conn.execute(f"SELECT count(*) FROM jobs {where}", params).fetchone()[0]
    return jobs, total


def _history(
    conn: sqlite3.Connection, max_items: int | None, offset: int | None
) -> list[HistoryEntry]:
    # ComfyUI: without an offset (or a negative one) the newest max_items, oldest
    # first; with one, skip that many from the oldest.
    if (offset is None or offset < 0) and max_items is not None:
        rows = conn.execute(HISTORY_NEWEST_FIRST, (max_items,)).fetchall()
        rows.reverse()
    else:
        limit = -1 if max_items is None else max_items
        rows = conn.execute(HISTORY_OLDEST_FIRST, (limit, max(0, offset or 0))).fetchall()
    return _entries(conn, rows)


def _history_entry(conn: sqlite3.Connection, prompt_id: str) -> HistoryEntry | None:
    rows = conn.execute(HISTORY_ONE, (prompt_id,)).fetchall()
    entries = _entries(conn, rows)
    return entries[0] if entries else None


def _entries(conn: sqlite3.Connection, rows: list[Any]) -> list[HistoryEntry]:
    ids = [row[0] for row in rows]
    messages = _messages_of(conn, ids)
    files = _files_of(conn, ids)
    width = len(_JOB_FIELDS)
    entries = []
    for row in rows:
        job = _job(row)
        status, outputs, meta = row[width : width + 3]
        result = JobResult(
            status=JobStatus(status),
            outputs=_loads(outputs),
            meta=_loads(meta),
            messages=messages.get(job.prompt_id, []),
            error=job.error,
            files=files.get(job.prompt_id, []),
        )
        entries.append(HistoryEntry(job, result))
    return entries


def _messages_of(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, list[list[Any]]]:
    found: dict[str, list[list[Any]]] = {}
    for prompt_id, kind, data in _rows_for(conn, EVENTS_OF, ids):
        found.setdefault(prompt_id, []).append([kind, _loads(data)])
    return found


#: Files looked up in one statement (four variables each).
LISTED_BATCH = 200


def _listed_outputs(conn: sqlite3.Connection, files: list[OutputFile]) -> set[OutputFile]:
    found: set[OutputFile] = set()
    for start in range(0, len(files), LISTED_BATCH):
        batch = files[start : start + LISTED_BATCH]
        rows = ", ".join(["(?, ?, ?, ?)"] * len(batch))
        sql = (
            "SELECT DISTINCT o.filename, o.subfolder, o.type, j.tenant FROM outputs o "
            "JOIN jobs j ON j.prompt_id = o.prompt_id "
            f"WHERE (o.filename, o.subfolder, o.type, j.tenant) IN (VALUES {rows})"
        )
        params = [v for f in batch for v in (f.filename, f.subfolder, f.type, f.tenant)]
        found.update(OutputFile(*row) for row in conn.execute(sql, params))
    return found


def _files_of(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, list[OutputFile]]:
    found: dict[str, list[OutputFile]] = {}
    for prompt_id, filename, subfolder, kind in _rows_for(conn, OUTPUTS_OF, ids):
        found.setdefault(prompt_id, []).append(OutputFile(filename, subfolder, kind))
    return found


def _rows_for(conn: sqlite3.Connection, template: str, ids: Sequence[str]) -> Iterable[Any]:
    for chunk in _chunks(ids):
        yield from conn.execute(template.format(marks=_marks(len(chunk))), list(chunk))


# -- one tenant's view (authentication on) ------------------------------------------------

SELECT_PENDING_OF = Q["select_pending_of"]
SELECT_RUNNING_OF = Q["select_running_of"]
COUNT_ACTIVE_OF = Q["count_active_of"]
HISTORY_OF_OLDEST_FIRST = Q["history_of_oldest_first"]
HISTORY_OF_NEWEST_FIRST = Q["history_of_newest_first"]
CLEAR_HISTORY_OF = Q["clear_history_of"]
OWNED = Q["owned"]
TENANTS_OF = Q["tenants_of"]


def _tenant_queue(conn: sqlite3.Connection, tenant: str) -> tuple[list[Job], list[Job]]:
    running = [_job(row) for row in conn.execute(SELECT_RUNNING_OF, (tenant,))]
    pending = [_job(row) for row in conn.execute(SELECT_PENDING_OF, (tenant,))]
    return running, pending


def _active_count(conn: sqlite3.Connection, tenant: str) -> int:
    count: int = conn.execute(COUNT_ACTIVE_OF, (tenant,)).fetchone()[0]
    return count


def _tenant_history(
    conn: sqlite3.Connection, max_items: int | None, offset: int | None, tenant: str
) -> list[HistoryEntry]:
    if (offset is None or offset < 0) and max_items is not None:
        rows = conn.execute(HISTORY_OF_NEWEST_FIRST, (tenant, max_items)).fetchall()
        rows.reverse()
    else:
        limit = -1 if max_items is None else max_items
        params = (tenant, limit, max(0, offset or 0))
        rows = conn.execute(HISTORY_OF_OLDEST_FIRST, params).fetchall()
    return _entries(conn, rows)


def _clear_tenant_history(conn: sqlite3.Connection, tenant: str) -> None:
    conn.execute(CLEAR_HISTORY_OF, (tenant,))


def _owned(conn: sqlite3.Connection, ids: list[str], tenant: str) -> set[str]:
    mine: set[str] = set()
    for chunk in _chunks(ids):
        sql = OWNED.format(marks=_marks(len(chunk)))
        mine.update(row[0] for row in conn.execute(sql, (tenant, *chunk)))
    return mine


def _tenants_of(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, str]:
    return dict(_rows_for(conn, TENANTS_OF, ids))
