"""The remote-job journal for a process without a store (`comfyfleet run`): in memory.

It keeps the store's journal contract (see `store.base.RemoteJobJournal`), so a
run never sends one request twice either; it just forgets when the process ends.
Only its own process writes it: every job is `owner`'s, and nobody else waits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.budgets import (
    Budget,
    BudgetCheck,
    BudgetExceeded,
    HoldRequest,
    Usage,
    may_be_billed,
)
from comfyfleet.domain.remote_jobs import (
    REMOTE_FINAL,
    NewRemoteJob,
    RemoteJob,
    RemoteJobState,
    check_remote_finish,
)
from comfyfleet.store.base import StoreError

_LIVE = frozenset({RemoteJobState.SUBMITTING, RemoteJobState.RUNNING})


@dataclass(frozen=True)
class Charge:
    """A job as budgets count it: whose prompt asked, and what it cost."""

    tenant: str | None
    prompt_id: str | None
    cost: float | None


@dataclass(frozen=True)
class _Hold:
    """What a prompt run on a backend holds or spent there (see `HoldRequest`)."""

    tenant: str
    held: Usage
    created_at: float


class MemoryJournal:
    owner = "local"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._jobs: dict[str, RemoteJob] = {}  # insertion order is creation order
        self._charges: dict[str, Charge] = {}  # by job id: what budgets count
        self._holds: dict[tuple[str, str], _Hold] = {}  # by prompt id and backend
        self._clock = clock

    async def record_remote_job(
        self, job: NewRemoteJob, budget: BudgetCheck | None = None
    ) -> RemoteJob:
        if job.id in self._jobs:
            raise StoreError(f"remote job {job.id!r} already exists")
        for existing in self._jobs.values():
            if existing.request_hash == job.request_hash and existing.state in _LIVE:
                return dataclasses.replace(existing, result=None)
        if budget is not None:
            tenant_used = await self.paid_usage(budget.tenant, budget.since)
            prompt_used = Usage()
            if job.prompt_id is not None:
                prompt_used = self._prompt_usage(job.prompt_id)
            refusal = budget.refusal(tenant_used, prompt_used)
            if refusal is not None:
                raise BudgetExceeded(refusal)
        now = self._clock()
        fields = dataclasses.asdict(job)
        self._charges[job.id] = Charge(job.tenant, job.prompt_id, job.cost)
        for name in ("tenant", "model", "cost"):  # kept beside the record
            del fields[name]
        record = RemoteJob(
            **fields,
            slot=None,
            state=RemoteJobState.SUBMITTING,
            remote_id=None,
            error=None,
            attempts=0,
            created_at=now,
            updated_at=now,
            owner=self.owner,
        )
        self._jobs[job.id] = record
        return record

    async def remote_job_submitted(
        self, job_id: str, remote_id: str, resume: dict[str, Any]
    ) -> bool:
        return self._update(
            job_id, state=RemoteJobState.RUNNING, remote_id=remote_id, resume=dict(resume)
        )

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
        check_remote_finish(state, result)
        changes: dict[str, Any] = {
            "state": state,
            "result": result,
            "result_type": result_type,
            "error": error,
            "finished_at": self._clock(),
        }
        if attempts is not None:
            changes["attempts"] = attempts
        return self._update(job_id, **changes)

    async def known_requests(self, hashes: Sequence[str]) -> set[str]:
        wanted = set(hashes)
        return {
            job.request_hash
            for job in self._jobs.values()
            if job.request_hash in wanted
            and (
                job.state in _LIVE
                or (job.state == RemoteJobState.SUCCEEDED and job.result is not None)
            )
        }

    async def paid_usage(self, tenant: str, since: float) -> Usage:
        return self._usage(lambda j: j.tenant == tenant, since) + self._held(
            lambda key, hold: hold.tenant == tenant and hold.created_at >= since
        )

    async def prompt_paid_usage(self, prompt_id: str) -> Usage:
        return self._prompt_usage(prompt_id)

    async def hold_paid_jobs(self, request: HoldRequest) -> Budget:
        key = (request.prompt_id, request.backend)
        earlier = self._holds.get(key)
        allowance, held = request.grant(
            await self.paid_usage(request.tenant, request.since),
            self._prompt_usage(request.prompt_id),
            Usage() if earlier is None else earlier.held,
            earlier is not None and earlier.created_at >= request.since,
        )
        self._holds[key] = _Hold(request.tenant, held, self._clock())
        return allowance

    async def settle_paid_jobs(self, prompt_id: str, backend: str, spent: Usage) -> bool:
        hold = self._holds.get((prompt_id, backend))
        if hold is None:
            return False
        held = Usage(min(spent.paid_jobs, hold.held.paid_jobs), min(spent.spend, hold.held.spend))
        self._holds[prompt_id, backend] = dataclasses.replace(hold, held=held)
        return True

    def _prompt_usage(self, prompt_id: str) -> Usage:
        return self._usage(lambda j: j.prompt_id == prompt_id, 0.0) + self._held(
            lambda key, _: key[0] == prompt_id
        )

    def _held(self, whose: Callable[[tuple[str, str], _Hold], bool]) -> Usage:
        used = Usage()
        for key, hold in self._holds.items():
            if whose(key, hold):
                used += hold.held
        return used

    def _usage(self, whose: Callable[[Charge], bool], since: float) -> Usage:
        """Jobs that may have been billed (see comfyfleet.spend.budget), of `whose`."""
        used = Usage()
        for job in self._jobs.values():
            charge = self._charges.get(job.id, Charge(None, None, None))
            if job.created_at >= since and whose(charge) and may_be_billed(job):
                used = used + Usage(1, charge.cost or 0.0)
        return used

    def _update(self, job_id: str, **changes: Any) -> bool:
        record = self._jobs.get(job_id)
        if record is None or record.state not in _LIVE:
            return False
        self._jobs[job_id] = dataclasses.replace(record, updated_at=self._clock(), **changes)
        return True

    async def assign_remote_slots(self, slots: Sequence[tuple[str, int]]) -> None:
        for job_id, slot in slots:
            if job_id in self._jobs:
                self._jobs[job_id] = dataclasses.replace(self._jobs[job_id], slot=slot)

    async def remote_job(self, job_id: str) -> RemoteJob | None:
        return self._jobs.get(job_id)

    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]:
        wanted = set(hashes)
        newest: dict[str, RemoteJob] = {}  # jobs in creation order: the last one wins
        for job in self._jobs.values():
            if job.request_hash in wanted:
                kept = newest.get(job.request_hash)
                if kept is None or not _succeeded(kept) or _succeeded(job):
                    newest[job.request_hash] = job
        return newest

    async def live_remote_jobs(self) -> list[RemoteJob]:
        return [
            dataclasses.replace(job, result=None)
            for job in self._jobs.values()
            if job.state in _LIVE
        ]

    async def adopt_remote_job(self, job_id: str) -> RemoteJob | None:
        record = self._jobs.get(job_id)
        if record is None or record.state not in _LIVE:
            return None
        return dataclasses.replace(record, result=None)

    async def wait_on_remote_job(self, job_id: str, waiting: bool) -> None:
        return None  # nobody else writes here: there is no other owner to wait on

    async def release_remote_job(self, job_id: str) -> bool:
        record = self._jobs.get(job_id)
        return record is not None and record.state in _LIVE

    async def prune_remote_jobs(self, finished_before: float) -> int:
        gone = [
            job.id
            for job in self._jobs.values()
            if job.state in REMOTE_FINAL and (job.finished_at or 0.0) < finished_before
        ]
        for job_id in gone:
            del self._jobs[job_id]
            self._charges.pop(job_id, None)
        for key in [k for k, hold in self._holds.items() if hold.created_at < finished_before]:
            del self._holds[key]
        return len(gone)


def _succeeded(job: RemoteJob) -> bool:
    return job.state == RemoteJobState.SUCCEEDED
