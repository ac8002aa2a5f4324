"""The PostgreSQL job store: asyncpg and a pool of connections, durable at every await.

Each public coroutine returns once its change is committed (PostgreSQL's own commit,
`synchronous_commit` as the server has it, on by default); reads that take several
statements read one snapshot. The event loop never waits on the database: asyncpg is
asynchronous, and large results are decoded on a worker thread.

The statements are the named blocks of postgres_queries.sql; the schema is the
migrations of postgres_schema.sql, applied on `open` under an advisory lock.

Claims and reservations are data, not callbacks: `candidates` reads the claimable jobs
in dispatch order (no lock, no transaction left open), the caller chooses among them,
and `claim_job` / `reserve_job` take the one chosen with an UPDATE fenced on the job
still being claimable at the attempt it was read with. A caller that loses the race
(another process took it, or it was cancelled) moves on to its next choice. No row is
locked for a job not taken, so no claim skips a job that another only looked at (as
`FOR UPDATE SKIP LOCKED` over the candidates would).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import asyncpg

from comfyfleet.domain.idempotency import IdempotencyKeyTaken, IdempotentRequest
from comfyfleet.domain.jobs import (
    HISTORIC,
    TERMINAL,
    DispatchKey,
    HistoryEntry,
    Job,
    JobResult,
    JobStatus,
    NewJob,
    OutputFile,
    order_key,
)
from comfyfleet.domain.prompt_events import EventsAppended
from comfyfleet.domain.webhooks import (
    EVENT_OF,
)
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_large
from comfyfleet.store import postgres_event_log as event_log
from comfyfleet.store import postgres_idempotency as idempotency
from comfyfleet.store.base import (
    DuplicateJob,
    PendingLimitReached,
    StoreError,
    WorkWake,
    clamp_candidates,
)
from comfyfleet.store.commit_times import CommitTimes
from comfyfleet.store.event_wakeups import EventsWake
from comfyfleet.store.postgres_listener import Listener
from comfyfleet.store.postgres_parts.access import DRIVER_ERRORS, Q, dumps, loads
from comfyfleet.store.postgres_parts.backends import PostgresBackends
from comfyfleet.store.postgres_parts.event_log import PostgresEventLog
from comfyfleet.store.postgres_parts.gateways import PostgresGateways
from comfyfleet.store.postgres_parts.journal import PostgresJournal
from comfyfleet.store.postgres_parts.webhooks import PostgresWebhookOutbox
from comfyfleet.store.postgres_text import (
    from_db,
    from_db_or_none,
    to_db,
    to_db_all,
    to_db_or_none,
)
from comfyfleet.store.postgres_url import redact_url
from comfyfleet.store.sql_blocks import load_blocks

T = TypeVar("T")

log = logging.getLogger(__name__)

SCHEMA = load_blocks("postgres_schema.sql")

#: Migrations by version: MIGRATIONS[n] takes a version n-1 database to version n.
MIGRATIONS = {int(name.split("_")[1]): sql for name, sql in SCHEMA.items() if name[-1].isdigit()}
SCHEMA_VERSION = max(MIGRATIONS)

#: Held while the schema is created or migrated, so two processes opening one database
#: at once do it one after the other (pg_advisory_xact_lock takes a bigint).
MIGRATION_LOCK = 0x636F6D6679666C  # "comfyfl"

#: Where wake-ups go (LISTEN/NOTIFY); the payload is the gateway that made the work,
#: then the job's place in the queue when one job became claimable (see parse_work).
WORK_CHANNEL = "comfyfleet_work"

#: How the listening connection names itself (pg_stat_activity.application_name).
LISTENER_NAME = "comfyfleet-listener"
#: Prompts woken one by one after the listener lost its connection; with more, every
#: follower reads the log again.
CATCH_UP_MAX = 10_000

#: The counter is a bigint sequence: a stored number past this does not move it.
COUNTER_MAX = 2**62

#: Characters of JSON decoded on the event loop (a millisecond or two); a result with
#: more is decoded on a worker thread.
DECODE_INLINE = 256 * 1024

#: The JSON columns of a job row (prompt, extra_data), which make most of its size.
JOB_JSON = (4, 5)

_dumps, _loads = dumps, loads


class PostgresStore(
    PostgresBackends, PostgresJournal, PostgresWebhookOutbox, PostgresEventLog, PostgresGateways
):
    """A `JobStore` in a PostgreSQL database.

    `url` is a libpq-style URL (`postgresql://user:password@host:port/dbname?...`).
    `schema` names the PostgreSQL schema that holds the tables (created when missing);
    None uses the connection's search_path (usually `public`). `pool_size` bounds the
    connections held open. `clock` gives the timestamps the store records.
    """

    #: Several gateways queue jobs in one database.
    shared = True

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if schema is not None and (not schema or "\x00" in schema):
            raise ValueError("schema must be a non-empty name without NUL")
        self._url = url
        self._schema = schema
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._clock = clock
        self._pool: Any = None  # asyncpg.Pool once open
        #: Every write's time until committed (metrics read it).
        self.commit_times = CommitTimes()
        # ComfyUI's counter is a sequence; numbers stored from elsewhere raise this floor,
        # which the next `next_number` applies (under the lock, so no other call of this
        # process runs between reading the sequence and moving it).
        self._counter = asyncio.Lock()
        self._counter_floor = 0
        self._admit_margin = 0  # read on `open` (see `submit`)
        self.owner = owner or f"gateway-{uuid.uuid4().hex[:12]}"
        self._owner_db = to_db(self.owner)
        self._instance = uuid.uuid4().hex
        self._listener = Listener(
            self._listening_connection, self._catch_up, (*DRIVER_ERRORS, TimeoutError)
        )
        self._wakes: list[WorkWake] = []
        self._event_wakes: list[EventsWake] = []

    def __repr__(self) -> str:
        return f"PostgresStore({redact_url(self._url)!r}, schema={self._schema!r})"

    # -- lifecycle ----------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or migrate the schema; ready for use afterwards."""
        if self._pool is not None:
            raise StoreError("the store is already open")
        settings = {} if self._schema is None else {"search_path": _quote(self._schema)}
        try:
            with self._wrapped("cannot connect"):
                pool = await asyncpg.create_pool(
                    self._url,
                    min_size=1,
                    max_size=self._pool_size,
                    timeout=self._connect_timeout,
                    server_settings=settings,
                    reset=_keep_session,
                )
        except ValueError as exc:  # a URL the driver cannot parse: say so, without it
            reason = redact_url(self._url, str(exc))
            raise StoreError(f"not a usable PostgreSQL URL: {reason}") from exc
        try:
            with self._wrapped("cannot prepare the schema"):
                async with pool.acquire() as conn, conn.transaction():
                    await _prepare(conn, self._schema, self._clock())
                    counted = await conn.fetchval(Q["max_counted_number"])
                    connections = int(await conn.fetchval("SHOW max_connections"))
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        # No more submits can be under way at once than the server takes connections.
        self._admit_margin = connections
        self._counter_floor = 0
        if counted is not None:  # resume past every counter value stored
            self._raise_counter(int(counted) + 1)

    async def close(self) -> None:
        """Release every connection (each change was committed when it returned)."""
        await self._listener.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            with self._wrapped("cannot close"):
                await pool.close()

    # -- queue --------------------------------------------------------------------

    async def submit(
        self, job: NewJob, claim_for: str | None = None, *, max_pending: int | None = None
    ) -> Job:
        """Durably queue a job as pending (or, with `claim_for`, as already claimed by
        that lane); DuplicateJob if the id exists, IdempotencyKeyTaken if the job's key is,
        PendingLimitReached when `max_pending` jobs are pending."""
        now = self._clock()
        limit = None if claim_for is not None else max_pending
        admit: tuple[int | None, int | None] = (limit, None)
        if limit is not None and limit > self._admit_margin:
            # Far from the limit (more places left than transactions can be open at
            # once), submits share the admission lock, side by side; near it (refused
            # so), the submit is tried again under the exclusive lock.
            admit = (limit, self._admit_margin)
        inserted = await self._insert(job, claim_for, now, admit)
        if inserted is None and admit[1] is not None:
            inserted = await self._insert(job, claim_for, now, (limit, None))
        if inserted is None:
            raise PendingLimitReached(limit or 0)
        queued = job.pending(inserted, now)
        if claim_for is None:
            return queued
        return queued.started(claim_for, 1, now, self.owner)

    async def _insert(
        self,
        job: NewJob,
        claim_for: str | None,
        now: float,
        admit: tuple[int | None, int | None],
    ) -> int | None:
        """The insert of `submit`: the job's seq, None when the pending limit refused it.
        `admit` is (the limit or None, the shared lock's margin or None: the exclusive)."""
        # A counter value from elsewhere (e.g. an import) keeps the counter ahead of it, for
        # every gateway: the insert moves the sequence.
        ahead = None
        if isinstance(job.number, int) and not isinstance(job.number, bool):
            ahead = abs(job.number) + 1 if abs(job.number) < COUNTER_MAX else None
        if is_large(job.prompt):
            encoded = await asyncio.to_thread(_job_params, job, now, claim_for)
        else:
            encoded = _job_params(job, now, claim_for)
        params = (*encoded, self._owner_db, ahead, *admit)
        keyed = job.idempotency

        async def insert(db: Any) -> int | IdempotentRequest | None:
            if keyed is not None:
                taken = await idempotency.claim(db, job.tenant, keyed, job.prompt_id, now)
                if taken is not None:
                    return taken
            try:
                seq: int | None = await db.fetchval(Q["insert_job"], *params)
            except asyncpg.UniqueViolationError as exc:
                raise DuplicateJob(f"prompt {job.prompt_id!r} already exists") from exc
            if seq is None and keyed is not None:  # refused: the key is not taken either
                raise _Refused
            return seq

        # A keyed job and its key commit together; a plain one is one statement.
        try:
            inserted = await (self._commit(insert) if keyed is None else self._write(insert))
        except _Refused:
            return None
        if isinstance(inserted, IdempotentRequest):
            raise IdempotencyKeyTaken(inserted)
        return inserted

    async def idempotent_request(self, tenant: str, key: str) -> IdempotentRequest | None:
        """The first submit under `tenant`'s `key`, if it was less than a window ago."""
        now = self._clock()
        return await self._run(lambda db: idempotency.first(db, tenant, key, now))

    async def candidates(self, limit: int, after: Job | None = None) -> list[Job]:
        """Claimable jobs in dispatch order, `limit` at most, past `after` when given."""
        limit = clamp_candidates(limit)
        with self._wrapped():
            if after is None:
                rows = await self._db().fetch(Q["claimable"], limit)
            else:
                key = order_key(after.front, after.number)
                query = Q["claimable_after"]
                rows = await self._db().fetch(query, limit, after.front, key, after.seq)
        return await _candidates(rows)

    async def claim_job(self, job: Job, lane: str) -> Job | None:
        """Start a candidate on `lane`; None when it is no longer claimable so."""
        now = self._clock()
        attempt = await self._commit(
            lambda db: db.fetchval(
                Q["claim_job"], to_db(job.prompt_id), to_db(lane), now, self._owner_db, job.attempt
            )
        )
        return None if attempt is None else job.started(lane, attempt, now, self.owner)

    async def reserve_job(self, job: Job, lane: str) -> Job | None:
        """Set a candidate aside for `lane`: it stays pending (listed, cancellable) but
        claims skip it. None when it is no longer claimable so."""
        attempt = await self._commit(
            lambda db: db.fetchval(
                Q["reserve_job"], to_db(job.prompt_id), to_db(lane), self._owner_db, job.attempt
            )
        )
        return None if attempt is None else replace(job, lane=lane, owner=self.owner)

    async def start_reserved(self, job: Job, lane: str) -> Job | None:
        """Run a job reserved for `job.lane` (or, with `job.lane` None, a pending job set
        aside for no lane) on `lane` (running, attempt + 1); None when it is no longer
        pending so (cancelled, claimed, or given back meanwhile)."""
        now = self._clock()
        attempt = await self._commit(
            lambda db: db.fetchval(
                Q["start_reserved"],
                to_db(job.prompt_id),
                to_db(lane),
                now,
                to_db_or_none(job.lane),
                self._owner_db,
            )
        )
        if attempt is None:
            return None
        return job.started(lane, attempt, now, self.owner)

    async def unreserve(self, prompt_ids: Sequence[str]) -> None:
        """Give reserved jobs back to the queue (claims see them again)."""
        ids = to_db_all(prompt_ids)
        if ids:
            await self._commit(lambda db: db.execute(Q["unreserve_jobs"], ids, self._owner_db))

    async def finish(self, prompt_id: str, attempt: int, result: JobResult) -> bool:
        """Record how an attempt ended, in one transaction; False if the attempt is stale."""
        if result.status not in TERMINAL:
            raise ValueError(f"a finished attempt needs a terminal status, not {result.status}")
        now = self._clock()
        encoded = _ResultParams(result)
        params = (
            to_db(prompt_id),
            attempt,
            encoded.status,
            now,
            encoded.error,
            encoded.historic,
            encoded.outputs,
            encoded.meta,
            *encoded.events,
            *encoded.files,
            EVENT_OF[result.status].value,
        )
        return bool(await self._commit(lambda db: db.fetchval(Q["finish_job"], *params)))

    async def requeue(
        self, prompt_id: str, attempt: int, reason: dict[str, Any] | None = None
    ) -> bool:
        """Put a running attempt back to pending; False if the attempt is stale.

        A `reason` is kept with the attempt (see `attempt_notes`)."""
        note = None if reason is None else _dumps(reason)
        params = (to_db(prompt_id), attempt, note, self._owner_db)
        return bool(await self._commit(lambda db: db.fetchval(Q["requeue_job"], *params)))

    async def attempt_notes(self, prompt_id: str) -> list[tuple[int, dict[str, Any]]]:
        """The reasons earlier attempts were given back, oldest first."""
        return (await self.attempt_notes_of([prompt_id])).get(prompt_id, [])

    async def attempt_notes_of(
        self, prompt_ids: Sequence[str]
    ) -> dict[str, list[tuple[int, dict[str, Any]]]]:
        """The reasons of many jobs in one read (e.g. every re-queued job at start)."""
        ids = to_db_all(dict.fromkeys(prompt_ids))
        if not ids:
            return {}
        rows = await self._run(lambda db: db.fetch(Q["attempt_notes_of"], ids))
        found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for key, attempt, data in rows:
            found.setdefault(from_db(key), []).append((attempt, _loads(data)))
        return found

    async def requeue_lane(self, lane_prefix: str) -> list[str]:
        """Put every job running on a lane named `lane_prefix*` back to pending; their
        ids in submission order."""
        params = (to_db(lane_prefix), self._owner_db, self._clock())
        rows = await self._commit(lambda db: db.fetch(Q["requeue_lane"], *params))
        if rows:
            await self._commit(lambda db: db.execute(Q["notify_work"], self._owner_db))
        return [from_db(key) for key, _ in sorted(rows, key=lambda row: row[1])]

    async def cancel(self, prompt_ids: Sequence[str], *, pending_only: bool) -> list[str]:
        """Cancel pending (and, unless `pending_only`, running) jobs; returns the changed
        ids in the order given."""
        ids = list(dict.fromkeys(prompt_ids))
        if not ids:
            return []
        statuses = ["pending"] if pending_only else ["pending", "running"]
        now = self._clock()
        rows = await self._commit(
            lambda db: db.fetch(Q["cancel_jobs"], now, to_db_all(ids), statuses)
        )
        changed = {from_db(row[0]) for row in rows}
        return [prompt_id for prompt_id in ids if prompt_id in changed]

    async def cancel_all_pending(self) -> list[str]:
        """Cancel every pending job; returns their ids in submission order."""
        now = self._clock()
        rows = await self._commit(lambda db: db.fetch(Q["cancel_pending"], now))
        return [from_db(key) for key, _ in sorted(rows, key=lambda row: row[1])]

    async def queue(self, *, tenant: str | None = None) -> tuple[list[Job], list[Job]]:
        """(running by start time, pending in dispatch order), from one snapshot; only
        the jobs of `tenant` when one is named."""
        scope = to_db_or_none(tenant)

        async def op(conn: Any) -> tuple[list[Any], list[Any]]:
            running = await conn.fetch(Q["select_running"], scope)
            return running, await conn.fetch(Q["select_pending"], scope)

        running, pending = await self._snapshot(op)
        return await _decoded(
            lambda: ([_job(row) for row in running], [_job(row) for row in pending]),
            _size(running, JOB_JSON) + _size(pending, JOB_JSON),
        )

    async def active_count(self, tenant: str) -> int:
        """How many jobs of `tenant` are pending or running."""
        count: int = await self._run(lambda db: db.fetchval(Q["count_active"], to_db(tenant)))
        return count

    async def owned(self, prompt_ids: Sequence[str], tenant: str) -> list[str]:
        """The ids among `prompt_ids` whose job belongs to `tenant`, in the order given."""
        ids = list(dict.fromkeys(prompt_ids))
        if not ids:
            return []
        rows = await self._run(lambda db: db.fetch(Q["owned"], to_db(tenant), to_db_all(ids)))
        mine = {from_db(row[0]) for row in rows}
        return [prompt_id for prompt_id in ids if prompt_id in mine]

    async def ping(self) -> None:
        await self._run(lambda db: db.fetchval(Q["ping"]))

    async def counts(self) -> dict[JobStatus, int]:
        """Jobs per status; every status is present."""
        rows = await self._run(lambda db: db.fetch(Q["count_statuses"]))
        counts = dict.fromkeys(JobStatus, 0)
        for status, count in rows:
            counts[JobStatus(status)] = count
        return counts

    async def next_number(self) -> int:
        """The next value of ComfyUI's submission counter (advances on every call)."""
        async with self._counter:
            number: int = await self._run(lambda db: db.fetchval(Q["next_number"]))
            if number < self._counter_floor:  # a number stored from elsewhere is ahead
                number = self._counter_floor
                await self._commit(lambda db: db.execute(Q["set_number"], number))
            self._counter_floor = number + 1
        return number

    def _raise_counter(self, at_least: int) -> None:
        """Make the counter hand out at least `at_least` next (it never goes back)."""
        if at_least <= COUNTER_MAX:
            self._counter_floor = max(self._counter_floor, at_least)

    async def orphaned(self) -> list[Job]:
        rows = await self._run(lambda db: db.fetch(Q["orphaned"], self._clock()))
        return [_job(row) for row in rows]

    async def requeue_orphaned(self, job: Job) -> bool:
        params = (to_db(job.prompt_id), job.attempt, self._clock(), self._owner_db)
        return bool(await self._commit(lambda db: db.fetchval(Q["requeue_orphaned"], *params)))

    async def adopt(self, job: Job) -> Job | None:
        note = _dumps({"kind": "adopted", "from": job.owner})
        params = (to_db(job.prompt_id), job.attempt, self._clock(), self._owner_db, note)
        if not await self._commit(lambda db: db.fetchval(Q["adopt"], *params)):
            return None
        return replace(job, attempt=job.attempt + 1, owner=self.owner)

    async def watch_work(self, wake: WorkWake) -> None:
        """LISTEN on a connection of its own (outside the pool); every gateway's wake-ups
        come through it, this one's own included."""
        self._wakes.append(wake)
        self._db()
        with self._wrapped("cannot listen for work"):
            await self._listener.listen(WORK_CHANNEL, self._work_notified)

    def _work_notified(self, payload: str) -> None:
        owner, key = parse_work(payload)
        for wake in self._wakes:
            wake(owner, key)

    async def _listening_connection(self) -> Any:
        # Named with its gateway, so an operator can tell whose it is.
        settings = {"application_name": f"{LISTENER_NAME} {self.owner}"[:63]}
        if self._schema is not None:
            settings["search_path"] = _quote(self._schema)
        return await asyncpg.connect(
            self._url, timeout=self._connect_timeout, server_settings=settings
        )

    async def _catch_up(self, since: float) -> None:
        """After the listener lost its connection: wake-ups for what may have been missed."""
        if self._wakes:
            self._work_notified("")  # no gateway's own: idle slots look at the queue
        if not self._event_wakes:
            return
        try:
            found = await self._run(lambda db: event_log.appended_since(db, since, CATCH_UP_MAX))
        except StoreError as exc:
            log.warning("cannot read what was appended while not listening: %s", exc)
            found = None
        if found is None or len(found) >= CATCH_UP_MAX:
            found = [EventsAppended(None, None, ours=False)]
        for woken in found:
            for wake in self._event_wakes:
                wake(woken)

    # -- jobs and history ---------------------------------------------------------

    async def get(self, prompt_id: str) -> Job | None:
        """The job with this id, if the store has it."""
        row = await self._run(lambda db: db.fetchrow(Q["select_job"], to_db(prompt_id)))
        return None if row is None else _job(row)

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
        wanted = None if statuses is None else sorted({status.value for status in statuses})
        scope = to_db_or_none(tenant)
        page_query = Q["jobs_newest_first" if newest_first else "jobs_oldest_first"]
        page_size = None if limit is None else max(0, limit)

        async def op(conn: Any) -> tuple[list[Any], int]:
            rows = await conn.fetch(page_query, wanted, scope, page_size, max(0, offset))
            return rows, await conn.fetchval(Q["jobs_total"], wanted, scope)

        rows, total = await self._snapshot(op)
        return await _decoded(lambda: [_job(row) for row in rows], _size(rows, JOB_JSON)), total

    async def history(
        self, max_items: int | None = None, offset: int | None = None, *, tenant: str | None = None
    ) -> list[HistoryEntry]:
        """History entries in completion order, paged as ComfyUI does (see JobStore); only
        `tenant`'s entries when one is named."""
        if max_items is not None and max_items <= 0:
            return []
        scope = to_db_or_none(tenant)
        # ComfyUI: without an offset (or a negative one) the newest max_items, oldest
        # first; with one, skip that many from the oldest.
        newest = (offset is None or offset < 0) and max_items is not None

        async def rows(conn: Any) -> list[Any]:
            if newest:
                found = await conn.fetch(Q["history_newest_first"], max_items, scope)
                return list(reversed(found))
            return list(
                await conn.fetch(Q["history_oldest_first"], max_items, max(0, offset or 0), scope)
            )

        return await self._entries(rows)

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None:
        """One history entry, or None."""
        key = to_db(prompt_id)
        entries = await self._entries(lambda conn: conn.fetch(Q["history_one"], key))
        return entries[0] if entries else None

    async def _entries(self, rows_of: Callable[[Any], Awaitable[list[Any]]]) -> list[HistoryEntry]:
        """The history entries of the rows `rows_of` reads, with their messages and
        files, all from one snapshot."""

        async def op(conn: Any) -> tuple[list[Any], list[Any], list[Any]]:
            rows = await rows_of(conn)
            if not rows:
                return rows, [], []
            ids = [row[0] for row in rows]
            events = await conn.fetch(Q["events_of"], ids)
            return rows, events, await conn.fetch(Q["outputs_of"], ids)

        rows, events, files = await self._snapshot(op)
        size = _size(rows, (*JOB_JSON, 17, 18)) + _size(events, (2,))
        return await _decoded(lambda: _history_entries(rows, events, files), size)

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """Remove these entries from the history; the jobs themselves stay."""
        ids = to_db_all(dict.fromkeys(prompt_ids))
        if ids:
            await self._commit(lambda db: db.execute(Q["delete_history"], ids))

    async def clear_history(self, *, tenant: str | None = None) -> None:
        """Remove every history entry (of `tenant`, when one is named); the jobs stay."""
        scope = to_db_or_none(tenant)
        await self._commit(lambda db: db.execute(Q["clear_history"], scope))

    async def prune_history(
        self, *, max_entries: int | None, max_age_seconds: float | None
    ) -> list[OutputFile]:
        """Delete the oldest finished jobs beyond the limits (see JobStore); returns their files."""
        if max_entries is None and max_age_seconds is None:
            return []
        cutoff = -math.inf if max_age_seconds is None else self._clock() - max_age_seconds
        return await self._write(lambda conn: _prune(conn, max_entries, cutoff))

    async def listed_outputs(self, files: Sequence[OutputFile]) -> set[OutputFile]:
        """Those of `files` a job still lists (see JobStore)."""
        if not files:
            return set()
        columns = [
            to_db_all(getattr(f, field) for f in files)
            for field in ("filename", "subfolder", "type", "tenant")
        ]
        rows = await self._run(lambda db: db.fetch(Q["listed_outputs"], *columns))
        return {OutputFile(*(from_db(value) for value in row)) for row in rows}


def parse_work(payload: str) -> tuple[str, DispatchKey | None]:
    """A work wake-up's payload (made by comfyfleet_work_payload, migration 11): `OWNER`
    (a gateway id has no space), or `OWNER FRONT ORDER_KEY SEQ` naming one job's
    `dispatch_key` (FRONT 0 for a front job, else 1). A place that does not parse is
    unknown: the wake-up still counts."""
    owner, _, place = payload.partition(" ")
    parts = place.split(" ")
    key: DispatchKey | None = None
    if len(parts) == 3:
        with contextlib.suppress(ValueError):
            key = (int(parts[0]), float(parts[1]), int(parts[2]))
    return from_db(owner), key


async def _keep_session(_conn: Any) -> None:
    """A connection going back to the pool keeps its session: the store leaves nothing
    in it (no session setting, advisory lock, cursor or LISTEN; a transaction left open
    is rolled back by the pool first), so the reset query asyncpg would send, a round
    trip on every release, is skipped."""


# -- schema ---------------------------------------------------------------------------


def _quote(name: str) -> str:
    """`name` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


async def _prepare(conn: Any, schema: str | None, now: float) -> None:
    """Create the schema or bring it up to date, one process at a time."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
    if schema is not None:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
    await conn.execute(SCHEMA["migrations_table"])
    version = await conn.fetchval("SELECT coalesce(max(version), 0) FROM comfyfleet_migrations")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the database has schema version {version}, newer than this program ({SCHEMA_VERSION})"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        await conn.execute(MIGRATIONS[target])
        await conn.execute(
            "INSERT INTO comfyfleet_migrations (version, applied_at) VALUES ($1, $2)", target, now
        )


# -- encoding -----------------------------------------------------------------------


class _Refused(ComfyfleetError):
    """The pending limit refused a keyed submit: its transaction is rolled back."""


def _job_params(job: NewJob, now: float, claim_for: str | None) -> tuple[Any, ...]:
    """The insert_job parameters: a pending job, or one already running on `claim_for`."""
    claimed = claim_for is not None
    return (
        to_db(job.prompt_id),
        _dumps(job.number),
        order_key(job.front, job.number),
        job.front,
        (JobStatus.RUNNING if claimed else JobStatus.PENDING).value,
        to_db_or_none(job.client_id),
        _dumps(job.prompt),
        _dumps(job.extra_data),
        _dumps(job.outputs),
        _dumps(job.node_errors),
        1 if claimed else 0,
        to_db_or_none(claim_for),
        now,
        now if claimed else None,
        to_db(job.tenant),
    )


class _ResultParams:
    """A JobResult encoded for the finish transaction (events and files as columns)."""

    def __init__(self, result: JobResult) -> None:
        self.status = result.status.value
        self.historic = result.status in HISTORIC
        self.error = None if result.error is None else _dumps(result.error)
        self.outputs = _dumps(result.outputs)
        self.meta = _dumps(result.meta)
        messages = result.messages
        self.events = (
            list(range(len(messages))),
            [to_db(str(kind)) for kind, _ in messages],
            [_dumps(data) for _, data in messages],
        )
        self.files = (
            [to_db(f.filename) for f in result.files],
            [to_db(f.subfolder) for f in result.files],
            [to_db(f.type) for f in result.files],
        )


def _job(row: Sequence[Any]) -> Job:
    return Job(
        prompt_id=from_db(row[0]),
        number=_loads(row[1]),
        front=row[2],
        seq=row[3],
        prompt=_loads(row[4]),
        extra_data=_loads(row[5]),
        outputs=_loads(row[6]),
        client_id=from_db_or_none(row[7]),
        status=JobStatus(row[8]),
        attempt=row[9],
        lane=from_db_or_none(row[10]),
        created_at=row[11],
        started_at=row[12],
        finished_at=row[13],
        error=None if row[14] is None else _loads(row[14]),
        tenant=from_db(row[15]),
        owner=from_db_or_none(row[16]),
    )


async def _candidates(rows: list[Any]) -> list[Job]:
    """Claim candidates, decoded on the loop when small, else on a worker thread."""
    if _size(rows, JOB_JSON) <= DECODE_INLINE:
        return [_job(row) for row in rows]
    return await asyncio.to_thread(lambda: [_job(row) for row in rows])


def _size(rows: Sequence[Any], columns: Sequence[int]) -> int:
    """Characters of text in these columns of `rows`."""
    return sum(len(row[column] or "") for row in rows for column in columns)


async def _decoded(decode: Callable[[], T], size: int) -> T:
    """`decode()`, on a worker thread when it has `size` characters of JSON to decode."""
    if size <= DECODE_INLINE:
        return decode()
    return await asyncio.to_thread(decode)


def _history_entries(rows: list[Any], events: list[Any], files: list[Any]) -> list[HistoryEntry]:
    messages: dict[str, list[list[Any]]] = {}
    for key, kind, data in events:
        messages.setdefault(key, []).append([from_db(kind), _loads(data)])
    written = _files_by_job(files, with_tenant=False)
    width = 17  # the job's columns, then the entry's
    entries = []
    for row in rows:
        job = _job(row)
        status, outputs, meta = row[width : width + 3]
        result = JobResult(
            status=JobStatus(status),
            outputs=_loads(outputs),
            meta=_loads(meta),
            messages=messages.get(row[0], []),
            error=job.error,
            files=written.get(row[0], []),
        )
        entries.append(HistoryEntry(job, result))
    return entries


def _files_by_job(rows: list[Any], *, with_tenant: bool) -> dict[str, list[OutputFile]]:
    """outputs_of rows by stored prompt_id, in the order written; each file names its
    job's tenant when `with_tenant`."""
    found: dict[str, list[OutputFile]] = {}
    for key, filename, subfolder, kind, tenant in rows:
        file = OutputFile(from_db(filename), from_db(subfolder), from_db(kind))
        if with_tenant:
            file = replace(file, tenant=from_db(tenant))
        found.setdefault(key, []).append(file)
    return found


async def _prune(conn: Any, max_entries: int | None, cutoff: float) -> list[OutputFile]:
    horizon_pos, horizon_time = 0, cutoff
    if max_entries is not None:
        row = await conn.fetchrow(Q["history_at_rank"], max(0, max_entries))
        if row is not None:
            horizon_pos, horizon_time = row[0], max(cutoff, math.nextafter(row[1], math.inf))
    victims = [r[0] for r in await conn.fetch(Q["history_before"], horizon_pos, cutoff)]
    # Jobs with no entry (cancelled, or entry deleted) go once they are older than
    # the newest entry dropped, so they cannot pile up forever.
    victims += [r[0] for r in await conn.fetch(Q["unlisted_before"], horizon_time)]
    if not victims:
        return []
    files = _files_by_job(await conn.fetch(Q["outputs_of"], victims), with_tenant=True)
    await conn.execute(Q["delete_jobs"], victims)
    return [file for key in victims for file in files.get(key, [])]
