"""The scheduler: admits jobs, feeds lane slots from the store, cancels exactly what is named.

Each lane slot runs a loop that claims the next eligible job from the store
when it is free, so order lives in one place (the store) and a job is never
held by a slot that cannot run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.engine.run import RunHandle
from comfyfleet.lanes.base import Lane
from comfyfleet.protocol import events
from comfyfleet.store.base import JobStore
from comfyfleet.store.records import Job, JobResult, JobStatus, NewJob

log = logging.getLogger(__name__)


class EventRouter(Protocol):
    """Where job events go (the server's WebSocket hub)."""

    def job_event(self, job: Job, event: EngineEvent) -> None: ...

    def job_finished(self, job: Job, status: JobStatus) -> None:
        """Called once the job's end is durably recorded."""

    def queue_changed(self, remaining: int) -> None: ...


class QueueFull(Exception):
    """Admission refused: too many pending jobs."""

    def __init__(self, pending: int, retry_after: float) -> None:
        super().__init__(f"{pending} prompts are pending; try again later")
        self.pending = pending
        self.retry_after = retry_after


@dataclass
class Running:
    job: Job
    lane: Lane
    handle: RunHandle = field(default_factory=RunHandle)
    cancelled: bool = False  # cancel (not interrupt): the job ends as cancelled
    requeue: bool = False  # shutdown: back to pending instead of finishing


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        lanes: Sequence[Lane],
        router: EventRouter,
        *,
        max_pending: int = 10_000,
        max_attempts: int = 3,
    ) -> None:
        self.store = store
        self.lanes = list(lanes)
        self.router = router
        self.max_pending = max_pending
        self.max_attempts = max_attempts
        self.running: dict[str, Running] = {}
        self.pending = 0
        self._work = asyncio.Event()
        self._stopping = False
        self._slots: list[asyncio.Task[None]] = []

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        for lane in self.lanes:
            requeued = await self.store.requeue_lane(lane.name)
            if requeued:
                log.info("re-queued %d jobs that were running on %s", len(requeued), lane.name)
        self.pending = (await self.store.counts()).get(JobStatus.PENDING, 0)
        for lane in self.lanes:
            for slot in range(lane.slots):
                task = asyncio.create_task(self._slot_loop(lane), name=f"{lane.name}-slot-{slot}")
                self._slots.append(task)

    async def stop(self, grace: float) -> None:
        """Stop claiming; let running jobs finish for `grace` seconds, then re-queue them."""
        self._stopping = True
        self._work.set()
        running = [t for t in self._slots if not t.done()]
        _, late = await asyncio.wait(running, timeout=grace) if running else (set(), set())
        if late:
            for entry in self.running.values():
                entry.requeue = True
                entry.handle.interrupt()
            await asyncio.wait(late, timeout=max(grace, 5.0))
        for task in self._slots:
            task.cancel()
        await asyncio.gather(*self._slots, return_exceptions=True)

    @property
    def queue_remaining(self) -> int:
        return max(0, self.pending) + len(self.running)

    def _queue_changed(self) -> None:
        self.router.queue_changed(self.queue_remaining)

    # -- admission ------------------------------------------------------------

    async def submit(self, new: NewJob) -> Job:
        if self._stopping:
            raise QueueFull(self.pending, retry_after=5.0)
        if self.pending >= self.max_pending:
            raise QueueFull(self.pending, retry_after=1.0)
        job = await self.store.submit(new)
        self.pending += 1
        self._queue_changed()
        self._work.set()
        return job

    # -- cancellation ---------------------------------------------------------

    def interrupt(self, prompt_id: str | None = None) -> list[str]:
        """Interrupt one running job, or every running job when no id is given."""
        targets = [prompt_id] if prompt_id is not None else list(self.running)
        hit = [t for t in targets if t in self.running]
        for target in hit:
            self.running[target].handle.interrupt()
        return hit

    async def delete_pending(self, prompt_ids: Sequence[str]) -> list[str]:
        removed = await self.store.cancel(prompt_ids, pending_only=True)
        self._forget_pending(len(removed))
        return removed

    async def clear_pending(self) -> list[str]:
        removed = await self.store.cancel_all_pending()
        self._forget_pending(len(removed))
        return removed

    async def cancel(self, prompt_ids: Sequence[str]) -> list[str]:
        """Cancel pending or running jobs; a running one is interrupted and ends cancelled."""
        cancelled = await self.delete_pending([p for p in prompt_ids if p not in self.running])
        for prompt_id in prompt_ids:
            entry = self.running.get(prompt_id)
            if entry is not None:
                entry.cancelled = True
                entry.handle.interrupt()
                cancelled.append(prompt_id)
        return cancelled

    def _forget_pending(self, count: int) -> None:
        if count:
            self.pending -= count
            self._queue_changed()

    # -- dispatch -------------------------------------------------------------

    async def _slot_loop(self, lane: Lane) -> None:
        while not self._stopping:
            try:
                await self._take_one(lane)
            except Exception:
                # A store failure must not cost the lane a slot; the job, if any, stays
                # running in the store and is re-queued at the next start.
                log.exception("slot of lane %s failed; retrying", lane.name)
                await asyncio.sleep(1.0)

    async def _take_one(self, lane: Lane) -> None:
        self._work.clear()
        job = await self.store.claim(lane.name, lane.can_run)
        if job is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._work.wait(), timeout=1.0)
            return
        # Not clamped: a claim can land before its submit's increment, and they net out.
        self.pending -= 1
        await self._run(lane, job)

    async def _run(self, lane: Lane, job: Job) -> None:
        entry = Running(job, lane)
        self.running[job.prompt_id] = entry
        self._queue_changed()
        finished: JobStatus | None = None
        try:
            try:
                result = await lane.run(job, lambda event: self._on_event(job, event), entry.handle)
            except Exception:
                log.exception("lane %s failed running %s", lane.name, job.prompt_id)
                result = None
            finished = await self._settle(entry, result)
        finally:
            del self.running[job.prompt_id]
            self._queue_changed()
        if finished is not None:
            self.router.job_finished(job, finished)

    def _on_event(self, job: Job, event: EngineEvent) -> None:
        # The done signal waits until the end is recorded (job_finished sends it).
        if isinstance(event, Message) and event.type == "executing" and event.data["node"] is None:
            return
        self.router.job_event(job, event)

    async def _settle(self, entry: Running, result: JobResult | None) -> JobStatus | None:
        """Record how the attempt ended; None when the job went back to the queue."""
        job = entry.job
        if entry.requeue or (result is None and job.attempt < self.max_attempts):
            if await self.store.requeue(job.prompt_id, job.attempt):
                self.pending += 1
                self._work.set()
            return None
        if result is None:
            result = lane_failure(job)
        if entry.cancelled:
            result = JobResult(JobStatus.CANCELLED, {}, {}, result.messages, result.error, [])
        if await self.store.finish(job.prompt_id, job.attempt, result):
            return result.status
        return None


def lane_failure(job: Job) -> JobResult:
    """The end of a job whose lane failed on every attempt."""
    error: dict[str, Any] = {
        "prompt_id": job.prompt_id,
        "node_id": None,
        "node_type": None,
        "executed": [],
        "exception_message": f"the job failed on its lane {job.attempt} times\n",
        "exception_type": "comfyfleet.LaneFailure",
        "traceback": [],
        "current_inputs": {},
        "current_outputs": [],
        "timestamp": events.timestamp_ms(),
    }
    return JobResult(JobStatus.ERROR, {}, {}, [["execution_error", error]], error, [])
