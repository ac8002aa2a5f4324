"""The remote-job journal on PostgreSQL: what the store runs for each journal verb.

`db` is an asyncpg pool or connection; every statement is one of the named blocks of
postgres_queries.sql. A final state is never overwritten: every update is fenced on
the row still being live, and on its owner (the gateway that sends and polls it). A
request hash has at most one live job (a unique partial index): single flight across
gateways. Driver errors are wrapped by the store, not here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from comfyfleet.domain.budgets import Budget, BudgetCheck, BudgetExceeded, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.store.base import StoreError
from comfyfleet.store.postgres_text import from_db, from_db_or_none, to_db, to_db_or_none
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("postgres_queries.sql")
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _row(row: Sequence[Any]) -> RemoteJob:
    return RemoteJob(
        id=from_db(row[0]),
        request_hash=from_db(row[1]),
        provider=from_db(row[2]),
        kind=from_db(row[3]),
        prompt_id=from_db_or_none(row[4]),
        node_id=from_db_or_none(row[5]),
        slot=row[6],
        state=RemoteJobState(row[7]),
        remote_id=from_db_or_none(row[8]),
        resume=json.loads(row[9]),
        error=None if row[10] is None else json.loads(row[10]),
        attempts=row[11],
        created_at=row[12],
        updated_at=row[13],
        finished_at=row[14],
        owner=from_db_or_none(row[15]),
        result=None if row[16] is None else bytes(row[16]),
        result_type=from_db_or_none(row[17]),
    )


#: Tries to record a job whose request's live job keeps ending just before it is read.
_RECORD_TRIES = 5


async def record(
    db: Any, job: NewRemoteJob, now: float, owner: str, budget: BudgetCheck | None = None
) -> RemoteJob:
    """Record `job`, or return the live job that already has its request hash. With
    `budget` (and `db` a connection in a transaction), a new job is first checked against
    it under its tenant's budget lock (BudgetExceeded: nothing written)."""
    params = (job.id, job.request_hash, job.provider, job.kind)
    for _ in range(_RECORD_TRIES):
        if budget is not None:
            await _check_budget(db, job, budget)
        try:
            row = await db.fetchrow(
                Q["record_remote_job"],
                *(to_db(value) for value in params),
                to_db_or_none(job.prompt_id),
                to_db_or_none(job.node_id),
                _dumps(job.resume),
                now,
                to_db(owner),
                to_db_or_none(job.tenant),
                to_db_or_none(job.model),
                job.cost,
            )
        except asyncpg.UniqueViolationError as exc:
            raise StoreError(f"remote job {job.id!r} already exists") from exc
        if row is None:  # the request has a live job: read it (unless it has just ended)
            # The insert stopped at the request before the id's check: make that one here,
            # off the common path (one round trip when the job is new).
            if await db.fetchval(Q["remote_job_exists"], to_db(job.id)):
                raise StoreError(f"remote job {job.id!r} already exists")
            row = await db.fetchrow(Q["remote_live_for_request"], to_db(job.request_hash))
        if row is not None:
            return _row(row)
    raise StoreError(f"remote job {job.id!r}: its request's live job kept changing")


async def _check_budget(db: Any, job: NewRemoteJob, budget: BudgetCheck) -> None:
    """BudgetExceeded when this new job would pass a budget; a request with a live job
    (no new job) passes."""
    await db.execute(Q["paid_lock"], to_db(budget.tenant))
    if await db.fetchrow(Q["remote_live_for_request"], to_db(job.request_hash)) is not None:
        return
    tenant_used = prompt_used = Usage()
    if budget.tenant_budget.limited:
        tenant_used = await paid_usage(db, budget.tenant, budget.since)
    if budget.counts_prompt and job.prompt_id is not None:
        prompt_used = await prompt_usage(db, job.prompt_id)
    refusal = budget.refusal(tenant_used, prompt_used)
    if refusal is not None:
        raise BudgetExceeded(refusal)


async def known_requests(db: Any, hashes: Sequence[str]) -> set[str]:
    rows = await db.fetch(Q["known_requests"], [to_db(h) for h in hashes])
    return {from_db(row[0]) for row in rows}


async def paid_usage(db: Any, tenant: str, since: float) -> Usage:
    return _usage(await db.fetchrow(Q["paid_by_tenant"], to_db(tenant), since))


async def prompt_usage(db: Any, prompt_id: str) -> Usage:
    return _usage(await db.fetchrow(Q["paid_by_prompt"], to_db(prompt_id)))


def _usage(row: Sequence[Any]) -> Usage:
    return Usage(int(row[0]), float(row[1]))


async def hold(db: Any, request: HoldRequest, now: float) -> Budget:
    """Grant the prompt its allowance on the backend and hold it for its tenant (`db` a
    connection in a transaction): counted and written under the tenant's budget lock."""
    await db.execute(Q["paid_lock"], to_db(request.tenant))
    prompt_id, backend = to_db(request.prompt_id), to_db(request.backend)
    row = await db.fetchrow(Q["hold_of"], prompt_id, backend)
    earlier = Usage() if row is None else Usage(int(row[0]), float(row[1]))
    allowance, held = request.grant(
        await paid_usage(db, request.tenant, request.since),
        await prompt_usage(db, request.prompt_id),
        earlier,
        row is not None and row[3] >= request.since,
    )
    values = (to_db(request.tenant), held.paid_jobs, held.spend, now)
    await db.execute(Q["hold"], prompt_id, backend, *values)
    return allowance


async def settle(db: Any, prompt_id: str, backend: str, spent: Usage) -> bool:
    status: str = await db.execute(
        Q["settle"], spent.paid_jobs, spent.spend, to_db(prompt_id), to_db(backend)
    )
    return status.endswith(" 1")


async def submitted(
    db: Any, job_id: str, remote_id: str, resume: str, now: float, owner: str
) -> bool:
    done = await db.fetchval(
        Q["remote_job_submitted"], to_db(job_id), to_db(remote_id), resume, now, to_db(owner)
    )
    return bool(done)


async def finish(
    db: Any,
    job_id: str,
    state: RemoteJobState,
    result: bytes | None,
    result_type: str | None,
    error: str | None,
    attempts: int | None,
    now: float,
    owner: str,
) -> bool:
    done = await db.fetchval(
        Q["finish_remote_job"],
        to_db(job_id),
        state.value,
        result,
        to_db_or_none(result_type),
        error,
        attempts,
        now,
        to_db(owner),
    )
    return bool(done)


async def adopt(db: Any, job_id: str, owner: str, now: float) -> RemoteJob | None:
    found = await db.fetchrow(Q["adopt_remote_job"], to_db(job_id), to_db(owner), now)
    return None if found is None else _row(found)


async def wait(db: Any, job_id: str, gateway: str, waiting: bool) -> None:
    query = Q["wait_on_remote_job"] if waiting else Q["stop_waiting_on_remote_job"]
    await db.execute(query, to_db(job_id), to_db(gateway))


async def release(conn: Any, job_id: str, owner: str, now: float) -> bool:
    """True: the job is `owner`'s and nobody live waits on it (cancel it). False: it
    went to a live waiter, or it is not `owner`'s live job. In one transaction."""
    key, me = to_db(job_id), to_db(owner)
    if not await conn.fetchval(Q["own_live_remote_job"], key, me):  # locks the row
        return False
    waiter = await conn.fetchval(Q["live_waiter"], key, me, now)
    if waiter is None:
        return True
    await conn.execute(Q["hand_over_remote_job"], key, me, waiter, now)
    return False


async def assign_slots(db: Any, slots: Sequence[tuple[str, int]]) -> None:
    latest = dict(slots)  # a job named twice gets its last slot, as one UPDATE each would
    await db.execute(
        Q["assign_remote_slots"], [to_db(job_id) for job_id in latest], list(latest.values())
    )


async def one(db: Any, job_id: str) -> RemoteJob | None:
    found = await db.fetchrow(Q["remote_job"], to_db(job_id))
    return None if found is None else _row(found)


async def reusable(db: Any, hashes: Sequence[str]) -> dict[str, RemoteJob]:
    rows = await db.fetch(Q["remote_reusable"], [to_db(h) for h in hashes])
    return {job.request_hash: job for job in map(_row, rows)}


async def live(db: Any, owner: str, now: float) -> list[RemoteJob]:
    return [_row(found) for found in await db.fetch(Q["remote_live"], to_db(owner), now)]


async def prune(db: Any, before: float) -> int:
    gone: int = await db.fetchval(Q["prune_remote_jobs"], before)
    await db.execute(Q["prune_holds"], before)
    return gone
