"""The remote-job journal of the PostgreSQL store (see `base.RemoteJobJournal`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.budgets import Budget, BudgetCheck, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import (
    NewRemoteJob,
    RemoteJob,
    RemoteJobState,
    check_remote_finish,
)
from comfyfleet.store.postgres_parts import journal_sql as journal
from comfyfleet.store.postgres_parts.access import PostgresAccess, dumps


class PostgresJournal(PostgresAccess):
    """Paid jobs recorded before they are sent, so none is paid for twice."""

    async def record_remote_job(
        self, job: NewRemoteJob, budget: BudgetCheck | None = None
    ) -> RemoteJob:
        """Record a paid job as `submitting`, before its job-creating request."""
        now = self._clock()
        if budget is not None:  # the count and the insert in one transaction, under a lock
            return await self._write(
                lambda conn: journal.record(conn, job, now, self.owner, budget)
            )
        # Each statement its own transaction: a new job is one round trip, and the rare
        # path (the request has a live job) reads what the insert left alone.
        return await self._commit(lambda db: journal.record(db, job, now, self.owner))

    async def known_requests(self, hashes: Sequence[str]) -> set[str]:
        """Of `hashes`, those the journal would send no new job for (see the seam)."""
        if not hashes:
            return set()
        return await self._run(lambda db: journal.known_requests(db, hashes))

    async def paid_usage(self, tenant: str, since: float) -> Usage:
        """The tenant's paid jobs recorded since `since`, and their cost (budgets)."""
        return await self._run(lambda db: journal.paid_usage(db, tenant, since))

    async def prompt_paid_usage(self, prompt_id: str) -> Usage:
        return await self._run(lambda db: journal.prompt_usage(db, prompt_id))

    async def hold_paid_jobs(self, request: HoldRequest) -> Budget:
        """Grant and hold a prompt's allowance on a backend (see the seam)."""
        now = self._clock()
        return await self._write(lambda conn: journal.hold(conn, request, now))

    async def settle_paid_jobs(self, prompt_id: str, backend: str, spent: Usage) -> bool:
        """What a prompt spent on a backend, in place of its hold (see the seam)."""
        return await self._commit(lambda db: journal.settle(db, prompt_id, backend, spent))

    async def remote_job_submitted(
        self, job_id: str, remote_id: str, resume: dict[str, Any]
    ) -> bool:
        """The provider's id for a live job; False if it is unknown, final or not ours."""
        encoded, now = dumps(resume), self._clock()
        return await self._commit(
            lambda db: journal.submitted(db, job_id, remote_id, encoded, now, self.owner)
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
        """How a live job ended; False if it is unknown, already final or not ours."""
        check_remote_finish(state, result)
        encoded, now = (None if error is None else dumps(error)), self._clock()
        return await self._commit(
            lambda db: journal.finish(
                db, job_id, state, result, result_type, encoded, attempts, now, self.owner
            )
        )

    async def assign_remote_slots(self, slots: Sequence[tuple[str, int]]) -> None:
        if slots:
            await self._commit(lambda db: journal.assign_slots(db, slots))

    async def remote_job(self, job_id: str) -> RemoteJob | None:
        return await self._run(lambda db: journal.one(db, job_id))

    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]:
        """By hash, the newest succeeded job (with result), else the newest job (see the
        seam), in one round trip."""
        if not hashes:
            return {}
        return await self._run(lambda db: journal.reusable(db, hashes))

    async def live_remote_jobs(self) -> list[RemoteJob]:
        now = self._clock()
        return await self._run(lambda db: journal.live(db, self.owner, now))

    async def adopt_remote_job(self, job_id: str) -> RemoteJob | None:
        now = self._clock()
        return await self._commit(lambda db: journal.adopt(db, job_id, self.owner, now))

    async def wait_on_remote_job(self, job_id: str, waiting: bool) -> None:
        await self._commit(lambda db: journal.wait(db, job_id, self.owner, waiting))

    async def release_remote_job(self, job_id: str) -> bool:
        now = self._clock()
        return await self._write(lambda conn: journal.release(conn, job_id, self.owner, now))

    async def prune_remote_jobs(self, finished_before: float) -> int:
        return await self._commit(lambda db: journal.prune(db, finished_before))
