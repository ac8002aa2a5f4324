"""The remote-job journal: paid jobs recorded before they are sent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from comfyfleet.domain.budgets import Budget, BudgetCheck, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState


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

    async def record_remote_job(
        self, job: NewRemoteJob, budget: BudgetCheck | None = None
    ) -> RemoteJob:
        """Durably record a job as `submitting`, owned by `owner`; raises StoreError if
        the id exists. When a live job with the same request hash exists, nothing is
        written and that job is returned instead (its id is not `job.id`). With `budget`,
        a new job is counted against it first, in the same step for every gateway of the
        store: BudgetExceeded (naming the budget), and nothing written, when it would pass
        its tenant's budget of the day or its prompt's."""

    async def known_requests(self, hashes: Sequence[str]) -> set[str]:
        """Of these request hashes, those a new job would not be sent for: one succeeded
        and kept its result (it is reused), or one is live (it is waited on)."""

    async def paid_usage(self, tenant: str, since: float) -> Usage:
        """The tenant's paid jobs recorded since `since` that may have been billed, and
        their cost (see comfyfleet.spend.budget), with its prompts' holds on backends."""

    async def prompt_paid_usage(self, prompt_id: str) -> Usage:
        """The prompt's paid jobs that may have been billed, and their cost, with its
        holds on backends: what its budget and an allowance count."""

    async def hold_paid_jobs(self, request: HoldRequest) -> Budget:
        """Grant a prompt about to run on `request.backend` its allowance out of its
        tenant's budget of the day and its own (see `HoldRequest.allowance`), and hold
        it: until settled, the hold counts in `paid_usage` and in the prompt's own count
        as what it holds. A new grant for the same prompt and backend replaces the last
        one's hold. The counts and the write are one step for every gateway."""

    async def settle_paid_jobs(self, prompt_id: str, backend: str, spent: Usage) -> bool:
        """What the prompt spent on the backend (its journal's count), counted from now
        on in place of its hold, and never more than it (the backend refuses jobs past its
        allowance: a larger count is not believed); False when no hold is known."""

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

    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]:
        """For requests about to be sent, in one read: by hash, the newest succeeded job
        with that hash (with its result), else the newest job with it in any state; a
        hash with no job is left out."""

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
