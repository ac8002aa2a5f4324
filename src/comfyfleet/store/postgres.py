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
import enum
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import asyncpg

from comfyfleet.domain.idempotency import IdempotencyKeyTaken, IdempotentRequest
from comfyfleet.domain.jobs import (
    Job,
    JobStatus,
    NewJob,
    order_key,
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
from comfyfleet.store.postgres_parts import idempotency_sql as idempotency
from comfyfleet.store.postgres_parts.access import DRIVER_ERRORS, Q, dumps, loads, quoted
from comfyfleet.store.postgres_parts.assets import PostgresAssets
from comfyfleet.store.postgres_parts.backends import PostgresBackends
from comfyfleet.store.postgres_parts.claims import PostgresClaims
from comfyfleet.store.postgres_parts.counter import COUNTER_MAX, PostgresCounter, resume_counter
from comfyfleet.store.postgres_parts.event_log import PostgresEventLog
from comfyfleet.store.postgres_parts.finishes import PostgresFinishes
from comfyfleet.store.postgres_parts.gateways import PostgresGateways
from comfyfleet.store.postgres_parts.history import PostgresHistory
from comfyfleet.store.postgres_parts.journal import PostgresJournal
from comfyfleet.store.postgres_parts.listener import Listener
from comfyfleet.store.postgres_parts.published_nodes import PostgresPublishedNodes
from comfyfleet.store.postgres_parts.rows import (
    DECODE_INLINE,
    JOB_JSON,
    decoded,
    job_from_row,
    text_size,
)
from comfyfleet.store.postgres_parts.takeover import PostgresTakeover
from comfyfleet.store.postgres_parts.url import redact_url
from comfyfleet.store.postgres_parts.wakeups import LISTENER_NAME as LISTENER_NAME
from comfyfleet.store.postgres_parts.wakeups import PostgresWakeups
from comfyfleet.store.postgres_parts.webhooks import PostgresWebhookOutbox
from comfyfleet.store.postgres_text import (
    from_db,
    to_db,
    to_db_all,
    to_db_or_none,
)
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

_dumps, _loads = dumps, loads


class PostgresStore(
    PostgresClaims,
    PostgresFinishes,
    PostgresAssets,
    PostgresHistory,
    PostgresCounter,
    PostgresTakeover,
    PostgresWakeups,
    PostgresBackends,
    PostgresJournal,
    PostgresWebhookOutbox,
    PostgresEventLog,
    PostgresGateways,
    PostgresPublishedNodes,
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
        self._admit_margin = 0  # read on `open` (see `submit`)
        self.owner = owner or f"gateway-{uuid.uuid4().hex[:12]}"
        self._owner_db = to_db(self.owner)
        self._instance = uuid.uuid4().hex
        self._listener = Listener(
            self._listening_connection, self._catch_up, (*DRIVER_ERRORS, TimeoutError)
        )
        self._wakes: list[WorkWake] = []
        self._event_wakes: list[EventsWake] = []
        self._batch_finishes()

    def __repr__(self) -> str:
        return f"PostgresStore({redact_url(self._url)!r}, schema={self._schema!r})"

    # -- lifecycle ----------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or migrate the schema; ready for use afterwards."""
        if self._pool is not None:
            raise StoreError("the store is already open")
        settings = {} if self._schema is None else {"search_path": quoted(self._schema)}
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
                    await resume_counter(conn)
                    connections = int(await conn.fetchval("SHOW max_connections"))
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        # No more submits can be under way at once than the server takes connections.
        self._admit_margin = connections

    async def close(self) -> None:
        """Release every connection (each change was committed when it returned)."""
        await self._listener.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            with self._wrapped("cannot close"):
                await pool.close()

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
        that lane); DuplicateJob if the id exists, IdempotencyKeyTaken if the job's key is,
        QueuedLimitReached or PendingLimitReached past `max_queued` or `max_pending`."""
        now = self._clock()
        admit = _Admit.first(max_pending, max_queued, self._admit_margin, claim_for is None)
        inserted = await self._insert(job, claim_for, now, admit)
        if inserted is _Refusal.PENDING_LIMIT and admit.margin is not None:
            inserted = await self._insert(job, claim_for, now, replace(admit, margin=None))
        if isinstance(inserted, _Refusal):
            raise admit.refused(inserted)
        seq, counted = inserted
        if counted is not None:
            job = job.numbered(counted)
        queued = job.pending(seq, now)
        if claim_for is None:
            return queued
        return queued.started(claim_for, 1, now, self.owner)

    async def _insert(
        self, job: NewJob, claim_for: str | None, now: float, admit: _Admit
    ) -> tuple[int, int | None] | _Refusal:
        """The insert of `submit`: the job's seq and the counter's number it took (when
        counted), or the limit that refused it."""
        params = await _insert_params(job, now, claim_for, self._owner_db, admit)
        keyed = job.idempotency

        async def insert(db: Any) -> tuple[int, int | None] | IdempotentRequest | _Refusal:
            if keyed is not None:
                taken = await idempotency.claim(db, job.tenant, keyed, job.prompt_id, now)
                if taken is not None:
                    return taken
            try:
                row = await db.fetchrow(Q["insert_job"], *params)
            except asyncpg.UniqueViolationError as exc:
                raise DuplicateJob(f"prompt {job.prompt_id!r} already exists") from exc
            if row[0] is not None:
                return int(row[0]), row[4]
            refusal = _Refusal(row[3])
            if keyed is not None:  # refused: the key is not taken either
                raise _Refused(refusal)
            return refusal

        # A keyed job and its key commit together; a plain one is one statement.
        try:
            inserted = await (self._commit(insert) if keyed is None else self._write(insert))
        except _Refused as refused:
            return refused.refusal
        if isinstance(inserted, IdempotentRequest):
            raise IdempotencyKeyTaken(inserted)
        return inserted

    async def idempotent_request(self, tenant: str, key: str) -> IdempotentRequest | None:
        """The first submit under `tenant`'s `key`, if it was less than a window ago."""
        now = self._clock()
        return await self._run(lambda db: idempotency.first(db, tenant, key, now))

    async def candidates(
        self, limit: int, after: Job | None = None, tenant: str | None = None
    ) -> list[Job]:
        """Claimable jobs in dispatch order, `limit` at most, past `after` when given,
        only `tenant`'s when given."""
        limit = clamp_candidates(limit)
        of: tuple[str, ...] = () if tenant is None else (to_db(tenant),)
        with self._wrapped():
            if after is None:
                query = Q["claimable"] if tenant is None else Q["claimable_of"]
                rows = await self._db().fetch(query, limit, *of)
            else:
                key = order_key(after.front, after.number)
                query = Q["claimable_after"] if tenant is None else Q["claimable_of_after"]
                rows = await self._db().fetch(query, limit, after.front, key, after.seq, *of)
        return await _candidates(rows)

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
        return await decoded(
            lambda: (
                [job_from_row(row) for row in running],
                [job_from_row(row) for row in pending],
            ),
            text_size(running, JOB_JSON) + text_size(pending, JOB_JSON),
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

    # -- jobs and history ---------------------------------------------------------

    async def get(self, prompt_id: str) -> Job | None:
        """The job with this id, if the store has it."""
        row = await self._run(lambda db: db.fetchrow(Q["select_job"], to_db(prompt_id)))
        return None if row is None else job_from_row(row)

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
        return await decoded(
            lambda: [job_from_row(row) for row in rows], text_size(rows, JOB_JSON)
        ), total


async def _keep_session(_conn: Any) -> None:
    """A connection going back to the pool keeps its session: the store leaves nothing
    in it (no session setting, advisory lock, cursor or LISTEN; a transaction left open
    is rolled back by the pool first), so the reset query asyncpg would send, a round
    trip on every release, is skipped."""


# -- schema ---------------------------------------------------------------------------


async def _prepare(conn: Any, schema: str | None, now: float) -> None:
    """Create the schema or bring it up to date, one process at a time."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
    if schema is not None:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}")
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


class _Refusal(enum.Enum):
    """Which limit refused a submit (insert_job's last column)."""

    TENANT_CAP = 1
    PENDING_LIMIT = 2


@dataclass(frozen=True)
class _Admit:
    """The limits of one insert: the pending limit, the margin of the shared admission
    lock (None: the exclusive), the tenant's cap; None for no limit."""

    limit: int | None
    margin: int | None
    cap: int | None

    @staticmethod
    def first(limit: int | None, cap: int | None, margin: int, queued: bool) -> _Admit:
        """A submit's first try; a job not `queued` (handed to a lane) meets no limit."""
        if not queued:
            return _Admit(None, None, None)
        # Far from the limit (more places left than transactions can be open at once),
        # submits share the admission lock, side by side; near it (refused so), the
        # submit is tried again under the exclusive lock.
        far = limit is not None and limit > margin
        return _Admit(limit, margin if far else None, cap)

    def refused(self, refusal: _Refusal) -> ComfyfleetError:
        if refusal is _Refusal.TENANT_CAP:
            return QueuedLimitReached(self.cap or 0)
        return PendingLimitReached(self.limit or 0)


class _Refused(ComfyfleetError):
    """A limit refused a keyed submit: its transaction is rolled back."""

    def __init__(self, refusal: _Refusal) -> None:
        super().__init__(refusal.name)
        self.refusal = refusal


async def _insert_params(
    job: NewJob, now: float, claim_for: str | None, owner: str, admit: _Admit
) -> tuple[Any, ...]:
    """insert_job's parameters; a large prompt is encoded off the loop."""
    # A counter value from elsewhere (e.g. an import) keeps the counter ahead of it, for
    # every gateway: the insert moves the sequence.
    ahead = None
    if isinstance(job.number, int) and not isinstance(job.number, bool):
        ahead = abs(job.number) + 1 if abs(job.number) < COUNTER_MAX else None
    if is_large(job.prompt):
        encoded = await asyncio.to_thread(_job_params, job, now, claim_for)
    else:
        encoded = _job_params(job, now, claim_for)
    counted = job.number is None
    return (*encoded, owner, ahead, admit.limit, admit.margin, admit.cap, counted)


def _job_params(job: NewJob, now: float, claim_for: str | None) -> tuple[Any, ...]:
    """The insert_job parameters: a pending job, or one already running on `claim_for`."""
    claimed = claim_for is not None
    number = 0 if job.number is None else job.number  # counted: the statement numbers it
    return (
        to_db(job.prompt_id),
        _dumps(number),
        order_key(job.front, number),
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


async def _candidates(rows: list[Any]) -> list[Job]:
    """Claim candidates, decoded on the loop when small, else on a worker thread."""
    if text_size(rows, JOB_JSON) <= DECODE_INLINE:
        return [job_from_row(row) for row in rows]
    return await asyncio.to_thread(lambda: [job_from_row(row) for row in rows])
