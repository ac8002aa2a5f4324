"""Running one paid job in its pool slot, with the journal kept at every step.

The journal is written before the job-creating request and gets the provider's
id right after, so a restart can re-attach; the downloaded result is kept there,
so a re-queue can reuse it. When the journal already has a live job for the
request (another gateway's), nothing is sent: the task follows that job. A
cancelled job is cancelled at the provider too, unless another gateway waits on
it: then it is handed to that gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from comfyfleet import imaging
from comfyfleet.domain.budgets import BudgetExceeded
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.errors import ComfyfleetError
from comfyfleet.fanout.drivers import Connection, Driver, Submitted
from comfyfleet.fanout.limits import Throttle
from comfyfleet.fanout.pool import Place
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.fanout.results import result_value, skipped_value
from comfyfleet.fanout.secrets import SecretVault
from comfyfleet.fanout.session import SessionLease
from comfyfleet.fanout.task import Task, TaskState
from comfyfleet.provider_http.errors import ProviderError
from comfyfleet.provider_http.retry import Cooldown
from comfyfleet.spend.guard import BudgetGuard, Charge
from comfyfleet.store.base import RemoteJobJournal

log = logging.getLogger(__name__)

#: How long a cancelled job may take to tell the provider (a submit in flight, the cancel).
CANCEL_GRACE = 30.0
#: The largest image whose memory is made ready while its job runs (larger: made on arrival).
MAX_PREPARED_PIXELS = 4096 * 4096
#: How long after its job is accepted an image's memory is made: not during the burst of
#: job-creating requests a batch starts with, whose last request it would delay.
PREPARE_AFTER = 0.25

#: Following a live job of the journal (see follow.Follower.follow).
Follow = Callable[[Task, RemoteJob, RemoteRequest | None], Awaitable[None]]


class LiveElsewhere(ComfyfleetError):
    """The journal has a live job for this request already (another gateway's)."""

    def __init__(self, record: RemoteJob) -> None:
        super().__init__(record.id)
        self.record = record


@dataclass
class Job:
    """One job as the runner sees it: new (a request) or re-attached (a journal record)."""

    task: Task
    driver: Driver
    api: ApiConfig
    request: RemoteRequest | None = None
    record: RemoteJob | None = None
    #: The journal write of the provider's id: it runs while the job is polled.
    journaling: asyncio.Future[bool] | None = None
    #: Memory for the image, made ready (in a worker thread) while the job runs.
    memory: asyncio.Future[imaging.ImageArray] | None = None

    @property
    def fresh(self) -> bool:
        """A new job (it needs a job-creating request), not one re-attached from the journal."""
        return self.request is not None

    @property
    def skip_error(self) -> bool:
        return self.request is not None and self.request.skip_error

    @property
    def resume(self) -> dict[str, Any]:
        return dict(self.record.resume) if self.record is not None else {}


class JobRunner:
    def __init__(
        self,
        journal: RemoteJobJournal,
        vault: SecretVault,
        sessions: SessionLease,
        throttle_for: Callable[[str, ApiConfig], Throttle],
        cooldown_for: Callable[[str, ApiConfig], Cooldown],
        on_unusable: Callable[[Task], None],
        follow: Follow,
        budgets: BudgetGuard | None = None,
    ) -> None:
        self.journal = journal
        self.budgets = budgets  # None: jobs are recorded with no tenant, cost or check
        self.follow = follow
        self.vault = vault
        self.sessions = sessions
        self._throttle_for = throttle_for
        self._cooldown_for = cooldown_for
        self._on_unusable = on_unusable
        # Set when the process is going away: a job cut off then is not the user's cancel.
        # It stays "running" in the journal, not cancelled at the provider, and the next
        # process re-attaches to it (no second paid job).
        self.detached = False

    async def run(self, job: Job, place: Place) -> None:
        """The job's whole life in the pool; never raises (the task records the outcome)."""
        task = job.task
        try:
            await place.wait_running()
            throttle = self._throttle_for(job.driver.name, job.api)
            async with throttle.slot():
                task.start()  # a wait for the endpoint's own limit still counts as queued
                if job.fresh:
                    await throttle.pace()
                data = await self._execute(job, place)
            # The remote job is over: its slot starts the next job while this result is
            # decoded (in a worker thread) and journaled (if it did not at the download).
            place.leave()
            await self._succeeded(job, data)
        except LiveElsewhere as elsewhere:
            place.leave()  # waiting on another gateway's job takes no slot here
            await self.follow(task, elsewhere.record, job.request)
        except asyncio.CancelledError:
            if not self.detached:
                await self._ended(job, RemoteJobState.CANCELLED, None)
            else:  # the id must be journaled, for the next process to re-attach
                await _quietly(self._journaled(job))
        except Exception as exc:
            await self._ended(job, RemoteJobState.FAILED, exc)
        finally:
            place.leave()
            if job.memory is not None:
                job.memory.cancel()  # not made yet: nobody will use it

    async def _execute(self, job: Job, place: Place) -> bytes:
        key = self.vault.resolve(job.api.key_ref)
        if job.fresh:
            await self._record(job)
        async with self.sessions.lease() as session:
            conn = Connection(
                session,
                job.api,
                key,
                self.vault.redactor(),
                self._cooldown_for(job.driver.name, job.api),
                finished_there=place.leave,
            )
            try:
                return await self._exchange(job, conn)
            except asyncio.CancelledError:
                if not self.detached:
                    await _quietly(self._cancel_remote(job, conn))
                raise
            finally:
                job.task.info.attempts = conn.tries.attempts

    async def _exchange(self, job: Job, conn: Connection) -> bytes:
        resume = job.resume
        if job.request is not None:
            submitted = await self._submit(job, conn, job.request)
            if submitted.data is not None:
                return submitted.data
            resume.update(submitted.resume)
            _prepare_memory(job)
        remote_id = job.task.info.remote_id
        if remote_id is None:
            raise ProviderError(job.driver.name, "the provider gave no job id", retryable=False)
        return await job.driver.result(conn, remote_id, resume)

    async def _record(self, job: Job) -> None:
        assert job.request is not None
        task = job.task
        resume = {**job.api.resume_fields(), "operation": job.request.operation}
        charge = await self._charge(task, job.request)
        new = NewRemoteJob(
            id=uuid.uuid4().hex,
            request_hash=job.request.request_hash,
            provider=job.driver.name,
            kind=task.kind,
            prompt_id=task.info.prompt_id,
            node_id=task.info.node_id,
            resume=resume,
            tenant=charge.tenant,
            model=charge.model,
            cost=charge.cost,
        )
        # Known before the write, and the write shielded: a cancel arriving now still
        # finds the row and closes it, instead of leaving it looking sent.
        task.info.journal_id = new.id
        try:
            recorded = await asyncio.shield(self.journal.record_remote_job(new, charge.check))
        except BudgetExceeded:
            task.info.journal_id = None  # nothing was written, and nothing is sent
            raise
        if recorded.id != new.id:
            task.info.journal_id = None
            raise LiveElsewhere(recorded)
        job.record = recorded

    async def _charge(self, task: Task, request: RemoteRequest) -> Charge:
        paid = request.paid_job()
        if self.budgets is None:
            return Charge(None, paid.model, None, None)
        return await self.budgets.charge(task.info.prompt_id, paid)

    async def _submit(self, job: Job, conn: Connection, request: RemoteRequest) -> Submitted:
        sending = asyncio.ensure_future(job.driver.submit(conn, request))
        if not job.driver.shield_submit:
            return await sending
        try:
            submitted = await asyncio.shield(sending)
        except asyncio.CancelledError:
            # The request may be on the wire: let it answer, so the job it created is
            # known and can be cancelled (the caller does that) rather than left billing.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                self._submitted(job, await asyncio.wait_for(sending, CANCEL_GRACE))
            raise
        self._submitted(job, submitted)
        return submitted

    def _submitted(self, job: Job, submitted: Submitted) -> None:
        """Note the provider's id, and journal it while polling starts: a poll that
        waited for the write would see the result that much later."""
        if submitted.remote_id is None or job.record is None:
            return
        job.task.info.remote_id = submitted.remote_id
        resume = {**job.record.resume, **submitted.resume}
        job.record = dataclasses.replace(
            job.record, state=RemoteJobState.RUNNING, remote_id=submitted.remote_id, resume=resume
        )
        write = self.journal.remote_job_submitted(job.record.id, submitted.remote_id, resume)
        job.journaling = asyncio.ensure_future(write)

    async def _journaled(self, job: Job) -> None:
        """Wait for the provider's id to be journaled (before the job's end is)."""
        if job.journaling is not None:
            await asyncio.shield(job.journaling)

    async def _cancel_remote(self, job: Job, conn: Connection) -> None:
        remote_id = job.task.info.remote_id
        if remote_id is None:
            return
        await self._journaled(job)
        journal_id = job.task.info.journal_id
        if journal_id is not None and not await self.journal.release_remote_job(journal_id):
            log.info("remote job %s left to the gateway that waits on it", remote_id)
            return
        resume = {**job.resume}
        cancelled = await job.driver.cancel(conn, remote_id, resume)
        log.info(
            "cancelled remote job %s at %s: %s",
            remote_id,
            job.driver.name,
            "done" if cancelled else "not supported there",
        )

    async def _succeeded(self, job: Job, data: bytes) -> None:
        value = await asyncio.to_thread(result_value, job.task.kind, data, _ready_memory(job))
        await self._journaled(job)
        if job.task.info.journal_id is not None:
            await self.journal.finish_remote_job(
                job.task.info.journal_id,
                RemoteJobState.SUCCEEDED,
                result=data,
                result_type=imaging.media_type(data),
                attempts=job.task.info.attempts,
            )
        job.task.settle(TaskState.SUCCESS, value)

    async def _ended(self, job: Job, state: RemoteJobState, exc: Exception | None) -> None:
        """A failed or cancelled job: journal it, then settle the task."""
        task = job.task
        redactor = self.vault.redactor()
        if exc is not None:
            describe(task, exc, redactor.text)
            log.warning("remote job for node %s failed: %s", task.info.node_id, task.info.error)
        if task.info.journal_id is not None:
            await _quietly(self._journaled(job))
            error = None if exc is None else error_record(task)
            finish = self.journal.finish_remote_job(
                task.info.journal_id, state, error=error, attempts=task.info.attempts
            )
            await _quietly(finish)
        if state == RemoteJobState.CANCELLED:
            task.settle(TaskState.CANCELLED)
        elif job.skip_error:
            try:  # in a worker thread: a video's stand-in is a file, written once
                value = await asyncio.to_thread(skipped_value, task.kind)
            except asyncio.CancelledError:
                task.settle(TaskState.CANCELLED)  # never left unsettled: collectors wait on it
                self._on_unusable(task)
                raise
            task.settle(TaskState.SKIPPED_ERROR, value, exc)
        else:
            task.settle(TaskState.FAILED, None, exc)
        self._on_unusable(task)


def _prepare_memory(job: Job) -> None:
    """Start making the image's memory ready, now that the job runs for a while."""
    size = job.request.result_size if job.request is not None else None
    if job.task.kind != "image" or size is None:
        return
    width, height = size
    if width > 0 and height > 0 and width * height <= MAX_PREPARED_PIXELS:
        job.memory = asyncio.ensure_future(_memory_later(height, width))


async def _memory_later(height: int, width: int) -> imaging.ImageArray:
    await asyncio.sleep(PREPARE_AFTER)
    return await asyncio.to_thread(imaging.mapped_image, height, width)


def _ready_memory(job: Job) -> imaging.ImageArray | None:
    """The image's memory if it was made in time (never waited for)."""
    memory = job.memory
    if memory is None or not memory.done() or memory.cancelled() or memory.exception():
        return None
    return memory.result()


def describe(task: Task, exc: BaseException, redact: Callable[[str], str]) -> None:
    """Copy an error's class, redacted message and HTTP status into the task's info."""
    task.info.error_class = type(exc).__name__
    task.info.error = redact(str(exc)) or type(exc).__name__
    if isinstance(exc, ProviderError):
        task.info.http_status = exc.status
        task.info.remote_id = task.info.remote_id or exc.task_id


def error_record(task: Task) -> dict[str, Any]:
    info = task.info
    return {"class": info.error_class, "message": info.error, "status": info.http_status}


async def _quietly(work: Any) -> None:
    """Finish cleanup work even while the task is being cancelled again, within a bound."""
    future = asyncio.ensure_future(work)
    try:
        await asyncio.wait_for(asyncio.shield(future), CANCEL_GRACE)
    except asyncio.CancelledError:
        # Cancelled once more: the cleanup still runs to its end on its own.
        raise
    except Exception:
        log.warning("cleanup after a remote job failed", exc_info=True)
