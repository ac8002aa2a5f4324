"""The remote-job journal of the SQLite store (see `base.RemoteJobJournal`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.budgets import Budget, BudgetCheck, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.store.sqlite_parts import journal_sql as journal
from comfyfleet.store.sqlite_parts.access import SQLiteAccess


class SQLiteJournal(SQLiteAccess):
    """Paid jobs recorded before they are sent, so none is paid for twice."""

    async def record_remote_job(
        self, job: NewRemoteJob, budget: BudgetCheck | None = None
    ) -> RemoteJob:
        """Record a paid job as `submitting`, before its job-creating request."""
        op = functools.partial(
            journal.record,
            job=job,
            resume=journal.encode(job.resume),
            now=self._clock(),
            owner=self.owner,
            budget=budget,
        )
        return await self._write(op)

    async def known_requests(self, hashes: Sequence[str]) -> set[str]:
        """Of `hashes`, those the journal would send no new job for (see the seam)."""
        if not hashes:
            return set()
        return await self._read(functools.partial(journal.known_requests, hashes=hashes))

    async def paid_usage(self, tenant: str, since: float) -> Usage:
        """The tenant's paid jobs recorded since `since`, and their cost (budgets)."""
        return await self._read(functools.partial(journal.paid_usage, tenant=tenant, since=since))

    async def prompt_paid_usage(self, prompt_id: str) -> Usage:
        return await self._read(functools.partial(journal.prompt_usage, prompt_id=prompt_id))

    async def hold_paid_jobs(self, request: HoldRequest) -> Budget:
        """Grant and hold a prompt's allowance on a backend (see the seam)."""
        return await self._write(
            functools.partial(journal.hold, request=request, now=self._clock())
        )

    async def settle_paid_jobs(self, prompt_id: str, backend: str, spent: Usage) -> bool:
        """What a prompt spent on a backend, in place of its hold (see the seam)."""
        op = functools.partial(journal.settle, prompt_id=prompt_id, backend=backend, spent=spent)
        return await self._write(op)

    async def remote_job_submitted(
        self, job_id: str, remote_id: str, resume: dict[str, Any]
    ) -> bool:
        """The provider's id for a live job; False if it is unknown, final or not ours."""
        op = functools.partial(
            journal.submitted,
            job_id=job_id,
            remote_id=remote_id,
            resume=journal.encode(resume),
            now=self._clock(),
            owner=self.owner,
        )
        return await self._write(op)

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
        """How a live job ended; False if it is unknown, already final or not ours."""
        op = functools.partial(
            journal.finish,
            job_id=job_id,
            state=state,
            result=result,
            result_type=result_type,
            error=journal.encode_finish(state, result, error),
            attempts=attempts,
            now=self._clock(),
            owner=self.owner,
        )
        return await self._write(op)

    async def assign_remote_slots(self, slots: Sequence[tuple[str, int]]) -> None:
        if slots:
            await self._write(functools.partial(journal.assign_slots, slots=list(slots)))

    async def remote_job(self, job_id: str) -> RemoteJob | None:
        return await self._read(functools.partial(journal.one, job_id=job_id))

    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]:
        """By hash, the newest succeeded job (with result), else the newest job (see the
        seam), in one read."""
        if not hashes:
            return {}
        return await self._read(functools.partial(journal.reusable, hashes=hashes))

    async def live_remote_jobs(self) -> list[RemoteJob]:
        return await self._read(
            functools.partial(journal.live, owner=self.owner, now=self._clock())
        )

    async def adopt_remote_job(self, job_id: str) -> RemoteJob | None:
        op = functools.partial(journal.adopt, job_id=job_id, owner=self.owner, now=self._clock())
        return await self._write(op)

    async def wait_on_remote_job(self, job_id: str, waiting: bool) -> None:
        op = functools.partial(journal.wait, job_id=job_id, gateway=self.owner, waiting=waiting)
        await self._write(op)

    async def release_remote_job(self, job_id: str) -> bool:
        op = functools.partial(journal.release, job_id=job_id, owner=self.owner, now=self._clock())
        return await self._write(op)

    async def prune_remote_jobs(self, finished_before: float) -> int:
        return await self._write(functools.partial(journal.prune, before=finished_before))
