"""Recording how an attempt ended: its end (retried while the store refuses), the retry
policy's decision, a job given back to the queue, and the events that wait on it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.lanes.base import DiscardsOutputs
from comfyfleet.scheduler.attempts import AttemptState, Running
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.scheduler.streams import PromptStreams
from comfyfleet.store.base import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest wait between attempts to record a job's end while the store refuses.
RECORD_RETRY_MAX = 2.0


class Recorder:
    def __init__(self, state: SchedulerState, streams: PromptStreams, retry: RetryPolicy) -> None:
        self._state = state
        self._streams = streams
        self._retry = retry

    async def start_recorded(self, entry: Running) -> bool:
        """Whether a reserved job's start, recorded while it ran, holds: retried while
        the store refuses (nothing was written then), False if the job was cancelled."""
        if entry.starting is None:
            return True  # claimed, not reserved: recorded before it ran
        store = self._state.store

        async def started() -> Job | None:
            assert entry.starting is not None
            try:
                return await entry.starting
            except StoreError:
                entry.record_start(store)  # the next try writes again
                raise

        if await self._retrying("the start", entry.job.prompt_id, started) is not None:
            return True
        self._state.pending += 1  # counted out when taken, and again by the cancel
        return False

    async def record(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> None:
        state, job = self._state, entry.job
        finished: JobResult | None = None
        try:
            finished = await self._retrying(
                "the end", job.prompt_id, lambda: self._settle(entry, result, failure)
            )
            if finished is None and result is not None and isinstance(entry.lane, DiscardsOutputs):
                await entry.lane.discard_outputs(job, result)  # given back, or fenced out
        except Exception:
            # The job stays running in the store and is recovered at the next start.
            log.exception("could not record the end of %s", job.prompt_id)
        finally:
            state.running.pop(job.prompt_id, None)
            if finished is not None:
                ended = finished
                entry.release_fenced()  # its own still: what it sent while fenced goes first
                entry.gate.pass_on(lambda: self._streams.end(job, ended))
            state.queue_changed()  # as from ComfyUI: the end event, the count, the done signal
        await entry.gate.opened.wait()  # after the previous job's done signal
        if finished is not None:
            state.observers.job_finished(job, finished)
        else:
            state.observers.job_stopped(job)

    async def give_back(self, job: Job, reason: dict[str, Any] | None) -> None:
        """Put a running attempt back to the queue (fenced), to leave `reason["lane"]`."""
        state = self._state
        if reason and reason.get("lane"):
            state.avoid_lane(job.prompt_id, reason["lane"])
        if await state.store.requeue(job.prompt_id, job.attempt, reason):
            state.pending += 1
            state.observers.job_requeued(job, reason)
            state.work_arrived(job.dispatch_key())

    async def _retrying(self, what: str, prompt_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """A job write, retried while the store refuses: the failed write was rolled back
        and job writes are fenced, so a retry is safe. Gives up only when the scheduler
        stops (the next start recovers the job)."""
        delay = 0.25
        while True:
            try:
                return await write()
            except StoreError as exc:
                if self._state.stopping:
                    raise
                log.warning("could not record %s of %s (%s); retrying", what, prompt_id, exc)
                await asyncio.sleep(delay)
                delay = min(RECORD_RETRY_MAX, delay * 2)

    async def _settle(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> JobResult | None:
        """Record how the attempt ended; None when the job went back to the queue."""
        job = entry.job
        if entry.state is AttemptState.GIVING_BACK:
            await self.give_back(job, None)
            return None
        if entry.state is AttemptState.TAKING_BACK and entry.handle.withdrawn:
            # Taken out of its backend's queue for a free slot: not a failed attempt.
            await self.give_back(job, {"kind": "taken_back", "lane": entry.lane.name})
            return None
        if entry.state is AttemptState.CANCELLING:
            # Cancelled, whatever the lane says; what it ran (outputs, files, events) is
            # kept, as ComfyUI keeps it for a prompt interrupted mid-run.
            ended = result or JobResult(JobStatus.CANCELLED, {}, {}, [])
            result = replace(ended, status=JobStatus.CANCELLED)
        else:
            decision = await self._retry.decide(job, entry.lane, result, failure)
            if decision.requeue:
                await self.give_back(job, decision.reason)
                return None
            result = decision.result
        assert result is not None
        self._state.avoid.pop(job.prompt_id, None)
        if await self._state.store.finish(job.prompt_id, job.attempt, result):
            return result
        return None
