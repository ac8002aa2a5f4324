"""Waiting on a paid job that another gateway sends and polls: through the journal.

A request has at most one live job in the journal, its owner's. A gateway that
wants it too sends nothing: it notes in the journal that it waits (so the owner
hands the job over rather than cancel it) and reads the job every interval until
it ends, taking the result as a finished job is reused. If the owner dies (its
lease runs out), the waiting gateway adopts the job and polls it with the
provider's stored id; a job whose id was never recorded cannot be polled, so it
ends as lost in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from comfyfleet.domain.remote_jobs import RemoteJob, RemoteJobState
from comfyfleet.fanout.request import RemoteRequest
from comfyfleet.fanout.task import Task, TaskState
from comfyfleet.provider_http.errors import AmbiguousSubmit, ProviderError
from comfyfleet.store.base import RemoteJobJournal

log = logging.getLogger(__name__)

#: Seconds between two reads of a job another gateway runs.
FOLLOW_INTERVAL = 0.25

LOST_IN_FLIGHT = (
    "the server stopped while this job's request was being sent, so it may have been "
    "created (and billed) without its id being recorded; it is not sent again "
    "automatically. Queue the prompt again to send a new job"
)


def lost_error() -> dict[str, object]:
    return {"class": "AmbiguousSubmit", "message": LOST_IN_FLIGHT, "status": None}


class FailedElsewhere(ProviderError):
    """The job failed at the gateway that ran it; its recorded (redacted) error."""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class FollowActions:
    """What the service does once a followed job's fate is known."""

    #: Send `request` as a new job for the task (the one followed ended without a result).
    send: Callable[[Task, RemoteRequest], Awaitable[None]]
    #: Poll the job, now this gateway's, for the task.
    poll: Callable[[Task, RemoteJob], Awaitable[None]]
    #: Settle the task with the job's result.
    reuse: Callable[[Task, RemoteJob], Awaitable[None]]
    #: Settle the task as failed (or skipped) with `error`.
    fail: Callable[[Task, Exception, RemoteRequest | None], Awaitable[None]]


class Follower:
    def __init__(
        self,
        journal: RemoteJobJournal,
        actions: FollowActions,
        interval: float = FOLLOW_INTERVAL,
    ) -> None:
        self.journal = journal
        self.actions = actions
        self.interval = interval

    async def follow(self, task: Task, record: RemoteJob, request: RemoteRequest | None) -> None:
        """Until the task is settled: wait on the journal's job `record`, adopting it if
        its owner dies. `request` (None for a job re-attached without one) is sent anew
        when the job ends without a result and without a failure (cancelled, lost)."""
        task.info.journal_id = record.id
        task.start()
        waiting = False
        try:
            while True:
                current = await self.journal.remote_job(record.id)
                if current is None or current.state not in (
                    RemoteJobState.SUBMITTING,
                    RemoteJobState.RUNNING,
                ):
                    await self._ended(task, current, request)
                    return
                taken = await self.journal.adopt_remote_job(record.id)
                if taken is not None:
                    if waiting:
                        waiting = False
                        await _stop_waiting(self.journal, record.id)
                    await self._take(task, taken, request)
                    return
                if not waiting:
                    await self.journal.wait_on_remote_job(record.id, True)
                    waiting = True
                await asyncio.sleep(self.interval)
        except asyncio.CancelledError:
            task.settle(TaskState.CANCELLED)
            raise
        finally:
            if waiting:
                await _stop_waiting(self.journal, record.id)

    async def _ended(
        self, task: Task, job: RemoteJob | None, request: RemoteRequest | None
    ) -> None:
        if job is not None and job.state == RemoteJobState.SUCCEEDED and job.result is not None:
            await self.actions.reuse(task, job)
        elif job is not None and job.state == RemoteJobState.FAILED:
            error = job.error or {}
            message = str(error.get("message") or "the remote job failed")
            status = _status(error.get("status"))
            failed = FailedElsewhere(job.provider, message, status=status, task_id=job.remote_id)
            await self.actions.fail(task, failed, request)
            task.info.error_class = str(error.get("class") or "FailedElsewhere")
        elif request is not None:  # cancelled by a gateway nobody told it waits (or pruned)
            await self.actions.send(task, request)
        else:
            task.settle(TaskState.CANCELLED)

    async def _take(self, task: Task, job: RemoteJob, request: RemoteRequest | None) -> None:
        """The job is this gateway's now: poll it, or end it when it cannot be polled."""
        log.info("took over remote job %s from gateway %s", job.id, job.owner)
        if job.remote_id is not None:
            task.info.remote_id = job.remote_id
            await self.actions.poll(task, job)
            return
        await self.journal.finish_remote_job(job.id, RemoteJobState.FAILED, error=lost_error())
        if request is not None and task.info.prompt_id != job.prompt_id:
            await self.actions.send(task, request)  # another prompt asks: a new job, knowingly
        else:
            await self.actions.fail(task, AmbiguousSubmit(job.provider, LOST_IN_FLIGHT), request)


async def _stop_waiting(journal: RemoteJobJournal, job_id: str) -> None:
    try:
        await asyncio.shield(journal.wait_on_remote_job(job_id, False))
    except Exception:  # the job's end drops the note as well
        log.warning("could not stop waiting on remote job %s", job_id, exc_info=True)


def _status(value: object) -> int | None:
    return value if isinstance(value, int) else None
