"""The remote-job journal's SQL: operations the SQLite store runs on its threads.

Writers run on the store's writer thread inside its transactions; readers on a
reader thread. A final state is never overwritten: every update is fenced on the
row still being live, and on its owner (the gateway that sends and polls it).
A request hash has at most one live job (a unique partial index): single flight
across every process that shares the file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.budgets import Budget, BudgetCheck, BudgetExceeded, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import (
    NewRemoteJob,
    RemoteJob,
    RemoteJobState,
    check_remote_finish,
)
from comfyfleet.store.base import StoreError
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts import schema as schema

Q = load_blocks("sqlite_queries.sql")

_dumps = json.JSONEncoder(separators=(",", ":")).encode

END_DUPLICATES = Q["journal_end_duplicates"]
DUPLICATE_ERROR = {
    "class": "Superseded",
    "message": "another job for the same request was live when the journal became "
    "shared; this one is no longer followed",
    "status": None,
}

INSERT = Q["journal_insert"]
SUBMITTED = Q["journal_submitted"]
FINISH = Q["journal_finish"]
DROP_WAITERS = Q["journal_drop_waiters"]
ADOPT = Q["journal_adopt"]
WAIT = Q["journal_wait"]
STOP_WAITING = Q["journal_stop_waiting"]
LIVE_WAITER = Q["journal_live_waiter"]
HAND_OVER = Q["journal_hand_over"]
SELECT_LIVE_FOR_HASH = Q["journal_select_live_for_hash"]
SELECT_OWN_LIVE = Q["journal_select_own_live"]
ASSIGN_SLOT = Q["journal_assign_slot"]
SELECT_ONE = Q["journal_select_one"]
SELECT_LIVE_ONE = Q["journal_select_live_one"]
SELECT_REUSABLE = Q["journal_select_reusable"]
SELECT_LIVE = Q["journal_select_live"]
PRUNE = Q["journal_prune"]
PAID_BY_TENANT = Q["journal_paid_by_tenant"]
KNOWN_REQUESTS = Q["journal_known_requests"]
#: Hashes bound per `IN (...)`: well under SQLite's variable limit.
CHUNK = 500
PAID_BY_PROMPT = Q["journal_paid_by_prompt"]
PRUNE_WAITERS = Q["journal_prune_waiters"]
HOLD_OF = Q["journal_hold_of"]
HOLD = Q["journal_hold"]
SETTLE = Q["journal_settle"]
PRUNE_HOLDS = Q["journal_prune_holds"]


def migrate_owners(conn: sqlite3.Connection) -> None:
    """Version 9: jobs get their owner (none for older ones: orphans, which any gateway
    may take over), one live job per request, and the waiters table."""
    if not schema.has_column(conn, "remote_jobs", "owner"):
        conn.execute("ALTER TABLE remote_jobs ADD COLUMN owner TEXT")
    conn.execute(END_DUPLICATES, (_dumps(DUPLICATE_ERROR),))
    schema.apply(conn, 10)  # one live job per request, and the waiters table


def add_budget_columns(conn: sqlite3.Connection) -> None:
    """Version 16: whose prompt asked for each job, its model and its cost (budgets);
    unknown for older jobs (they count for no tenant)."""
    for column, kind in (("tenant", "TEXT"), ("model", "TEXT"), ("cost", "REAL")):
        if not schema.has_column(conn, "remote_jobs", column):
            conn.execute(f"ALTER TABLE remote_jobs ADD COLUMN {column} {kind}")
    schema.apply(conn, 16)


def _row(row: Sequence[Any]) -> RemoteJob:
    return RemoteJob(
        id=row[0],
        request_hash=row[1],
        provider=row[2],
        kind=row[3],
        prompt_id=row[4],
        node_id=row[5],
        slot=row[6],
        state=RemoteJobState(row[7]),
        remote_id=row[8],
        resume=json.loads(row[9]),
        error=None if row[10] is None else json.loads(row[10]),
        attempts=row[11],
        created_at=row[12],
        updated_at=row[13],
        finished_at=row[14],
        owner=row[15],
        result=None if row[16] is None else bytes(row[16]),
        result_type=row[17],
    )


# -- writer thread ------------------------------------------------------------------


def record(
    conn: sqlite3.Connection,
    job: NewRemoteJob,
    resume: str,
    now: float,
    owner: str,
    budget: BudgetCheck | None = None,
) -> RemoteJob:
    """Record `job`, or return the live job that already has its request hash. With
    `budget`, a new job is first checked against it (BudgetExceeded: nothing written);
    the writer thread makes the count and the insert one step for every process."""
    if (
        budget is not None
        and conn.execute(SELECT_LIVE_FOR_HASH, (job.request_hash,)).fetchone() is None
    ):
        check_budget(conn, job, budget)
    params = (job.id, job.request_hash, job.provider, job.kind, job.prompt_id, job.node_id)
    extra = (job.tenant, job.model, job.cost)
    try:
        inserted = conn.execute(INSERT, (*params, resume, now, now, owner, *extra)).fetchall()
    except sqlite3.IntegrityError:  # the id (the only other unique key) is taken
        raise StoreError(f"remote job {job.id!r} already exists") from None
    if inserted:
        return _row(inserted[0])
    # The request has a live job; the insert did not get as far as the id's check.
    if conn.execute(Q["journal_exists"], (job.id,)).fetchone():
        raise StoreError(f"remote job {job.id!r} already exists")
    return _row(conn.execute(SELECT_LIVE_FOR_HASH, (job.request_hash,)).fetchone())


def check_budget(conn: sqlite3.Connection, job: NewRemoteJob, budget: BudgetCheck) -> None:
    tenant_used = prompt_used = Usage()
    if budget.tenant_budget.limited:
        tenant_used = paid_usage(conn, budget.tenant, budget.since)
    if budget.counts_prompt and job.prompt_id is not None:
        prompt_used = prompt_usage(conn, job.prompt_id)
    refusal = budget.refusal(tenant_used, prompt_used)
    if refusal is not None:
        raise BudgetExceeded(refusal)


def paid_usage(conn: sqlite3.Connection, tenant: str, since: float) -> Usage:
    return _usage(conn.execute(PAID_BY_TENANT, (tenant, since)).fetchone())


def prompt_usage(conn: sqlite3.Connection, prompt_id: str) -> Usage:
    return _usage(conn.execute(PAID_BY_PROMPT, (prompt_id,)).fetchone())


def _usage(row: Sequence[Any]) -> Usage:
    return Usage(int(row[0]), float(row[1]))


def hold(conn: sqlite3.Connection, request: HoldRequest, now: float) -> Budget:
    """Grant the prompt its allowance on the backend and hold it for its tenant: the
    counts and the write one step, on the writer thread every process shares."""
    row = conn.execute(HOLD_OF, (request.prompt_id, request.backend)).fetchone()
    earlier = Usage() if row is None else Usage(int(row[0]), float(row[1]))
    allowance, held = request.grant(
        paid_usage(conn, request.tenant, request.since),
        prompt_usage(conn, request.prompt_id),
        earlier,
        row is not None and row[3] >= request.since,
    )
    values = (request.prompt_id, request.backend, request.tenant, held.paid_jobs, held.spend, now)
    conn.execute(HOLD, values)
    return allowance


def settle(conn: sqlite3.Connection, prompt_id: str, backend: str, spent: Usage) -> bool:
    return conn.execute(SETTLE, (spent.paid_jobs, spent.spend, prompt_id, backend)).rowcount == 1


def submitted(
    conn: sqlite3.Connection, job_id: str, remote_id: str, resume: str, now: float, owner: str
) -> bool:
    return conn.execute(SUBMITTED, (remote_id, resume, now, job_id, owner)).rowcount == 1


def finish(
    conn: sqlite3.Connection,
    job_id: str,
    state: RemoteJobState,
    result: bytes | None,
    result_type: str | None,
    error: str | None,
    attempts: int | None,
    now: float,
    owner: str,
) -> bool:
    params = (state.value, result, result_type, error, attempts, now, now, job_id, owner)
    if conn.execute(FINISH, params).rowcount != 1:
        return False
    conn.execute(DROP_WAITERS, (job_id,))
    return True


def adopt(conn: sqlite3.Connection, job_id: str, owner: str, now: float) -> RemoteJob | None:
    if conn.execute(ADOPT, (owner, now, job_id, owner, now)).rowcount != 1:
        return None
    return _row(conn.execute(SELECT_LIVE_ONE, (job_id,)).fetchone())


def wait(conn: sqlite3.Connection, job_id: str, gateway: str, waiting: bool) -> None:
    conn.execute(WAIT if waiting else STOP_WAITING, (job_id, gateway))


def release(conn: sqlite3.Connection, job_id: str, owner: str, now: float) -> bool:
    """True: the job is `owner`'s and nobody live waits on it (cancel it). False: it
    went to a live waiter, or it is not `owner`'s live job."""
    if conn.execute(SELECT_OWN_LIVE, (job_id, owner)).fetchone() is None:
        return False
    waiter = conn.execute(LIVE_WAITER, (job_id, owner, now)).fetchone()
    if waiter is None:
        return True
    conn.execute(HAND_OVER, (waiter[0], now, job_id, owner))
    conn.execute(STOP_WAITING, (job_id, waiter[0]))
    return False


def assign_slots(conn: sqlite3.Connection, slots: Sequence[tuple[str, int]]) -> None:
    conn.executemany(ASSIGN_SLOT, [(slot, job_id) for job_id, slot in slots])


def prune(conn: sqlite3.Connection, before: float) -> int:
    gone = conn.execute(PRUNE, (before,)).rowcount
    conn.execute(PRUNE_WAITERS)
    conn.execute(PRUNE_HOLDS, (before,))
    return gone


# -- reader threads ------------------------------------------------------------------


def one(conn: sqlite3.Connection, job_id: str) -> RemoteJob | None:
    found = conn.execute(SELECT_ONE, (job_id,)).fetchone()
    return None if found is None else _row(found)


def reusable(conn: sqlite3.Connection, hashes: Sequence[str]) -> dict[str, RemoteJob]:
    rows = conn.execute(SELECT_REUSABLE, (json.dumps(list(hashes)),))
    return {job.request_hash: job for job in map(_row, rows)}


def live(conn: sqlite3.Connection, owner: str, now: float) -> list[RemoteJob]:
    return [_row(found) for found in conn.execute(SELECT_LIVE, (owner, now))]


def known_requests(conn: sqlite3.Connection, hashes: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(hashes), CHUNK):
        chunk = list(hashes[start : start + CHUNK])
        query = KNOWN_REQUESTS.format(marks=", ".join("?" * len(chunk)))
        found.update(row[0] for row in conn.execute(query, chunk))
    return found


def encode_finish(
    state: RemoteJobState, result: bytes | None, error: dict[str, Any] | None
) -> str | None:
    """Check a finish on the caller's thread; returns the error as JSON."""
    check_remote_finish(state, result)
    return None if error is None else _dumps(error)


def encode(value: dict[str, Any]) -> str:
    return _dumps(value)
