"""Running one attempt: start it on a lane (on a slot's behalf), wait until the lane
frees the slot, and let the rest (reading the result, recording the end) go on while
the slot takes its next job; that job's events wait for this one's done signal."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.lanes.base import Lane, LaneRun
from comfyfleet.logs import tag_job
from comfyfleet.scheduler.attempts import AttemptState, EventGate, Running
from comfyfleet.scheduler.recording import Recorder
from comfyfleet.scheduler.slots import LaneSlots, Slot, Started
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.scheduler.streams import PromptStreams

log = logging.getLogger(__name__)

#: Told when a remote lane's backend has queued a slot's prompt (it may reserve ahead).
Accepted = Callable[[LaneSlots, Slot, LaneRun], None]


class Runner:
    def __init__(
        self,
        state: SchedulerState,
        streams: PromptStreams,
        recorder: Recorder,
        accepted: Accepted,
    ) -> None:
        self._state = state
        self._streams = streams
        self._recorder = recorder
        self._accepted = accepted
        self.resumes: set[asyncio.Task[None]] = set()  # jobs followed on their backend

    async def run(
        self,
        lane: Lane,
        job: Job,
        slot: Slot | None = None,
        *,
        resume: bool = False,
        reserved: Job | None = None,
    ) -> asyncio.Task[None]:
        """Run one attempt until the lane's slot is free again: the attempt ended, or the
        lane released the slot early. What is left goes on in the task returned (also the
        slot's `previous`)."""
        return await self.until_released(self.start(lane, job, slot, resume, reserved), slot)

    def start(
        self,
        lane: Lane,
        job: Job,
        slot: Slot | None,
        resume: bool = False,
        reserved: Job | None = None,
    ) -> Started:
        """Count the job as running on the lane and start its attempt."""
        state = self._state
        after = slot.previous if slot is not None else None
        entry = Running(job, lane, EventGate(after), reserved=reserved)
        if resume:
            self._streams.resumed(job)
        state.running[job.prompt_id] = entry
        state.observers.job_started(job)
        slots = state.lanes.get(lane.name)
        if slots is not None:
            state.taken(slots)
            state.warmed(slots, state.warmth_of(job))
            if slot is not None and not lane.in_process:
                entry.handle.on_accept(lambda: self._accepted(slots, slot, entry.handle))
        state.queue_changed()
        finishing = asyncio.create_task(self._finish(entry, resume), name=f"run-{job.prompt_id}")
        if slot is not None:
            slot.previous = finishing
        if entry.reserved is not None:
            # Recorded once the backend has the prompt (or the attempt ended without it):
            # the submit goes out first, no commit of the store competing with it.
            entry.handle.on_accept(lambda: self._record_start(entry))
        return Started(entry, finishing)

    def _record_start(self, entry: Running) -> None:
        """Record a reserved job's start (once)."""
        if entry.starting is None:
            entry.record_start(self._state.store)
            assert entry.starting is not None
            # Cancelled in the queue before its start was recorded: stop it there.
            entry.starting.add_done_callback(lambda done: _stop_if_refused(done, entry.handle))

    async def until_released(self, started: Started, slot: Slot | None) -> asyncio.Task[None]:
        """Wait until the lane frees the slot; the rest of the attempt goes on in the
        task returned."""
        began = time.monotonic()
        try:
            await started.entry.handle.released.wait()  # set early by the lane, or by `_finish`
        except asyncio.CancelledError:
            await self.abandon(started, slot)
            raise
        self._slot_freed(started, slot)
        self._state.shares.released(started.entry.job.tenant, time.monotonic() - began)
        if slot is not None:
            slot.last_run = time.monotonic() - began
        self._state.settle(started.finishing)
        return started.finishing

    async def abandon(self, started: Started, slot: Slot | None) -> None:
        """The slot was stopped mid-run: the job stays running in the store; the next
        start recovers it (re-queued, or asked after on its backend)."""
        entry = started.entry
        try:
            started.finishing.cancel()
            await asyncio.wait([started.finishing])
            if self._state.running.get(entry.job.prompt_id) is entry:
                del self._state.running[entry.job.prompt_id]
        finally:
            self._slot_freed(started, slot)

    def follow(self, lane: Lane, job: Job) -> None:
        """Follow a job already on `lane`'s backend (found there, not submitted now)."""
        task = asyncio.create_task(self._resume(lane, job), name=f"resume-{job.prompt_id}")
        self.resumes.add(task)
        task.add_done_callback(self.resumes.discard)

    async def _resume(self, lane: Lane, job: Job) -> None:
        await asyncio.wait([await self.run(lane, job, resume=True)])

    def _slot_freed(self, started: Started, slot: Slot | None) -> None:
        slots = self._state.lanes.get(started.entry.lane.name)
        if slots is not None:
            self._state.released(slots)
            if slot is not None:
                self._state.unaccept(slots, slot)

    async def _finish(self, entry: Running, resume: bool) -> None:
        state = self._state
        tag_job(entry.job)  # this task is the attempt: its log lines name the job
        try:
            result, failure = await self._attempt(entry, resume)
            entry.ended = True
        except BaseException:
            state.running.pop(entry.job.prompt_id, None)
            state.queue_changed()
            raise
        finally:
            entry.handle.release()  # the lane is done: its slot takes the next job meanwhile
            if entry.reserved is not None:
                self._record_start(entry)  # never accepted (refused, failed, stopped): now
        if await self._recorder.start_recorded(entry):
            await self._recorder.record(entry, result, failure)
        else:
            # Cancelled in the queue before its start was recorded: it ends there.
            state.running.pop(entry.job.prompt_id, None)
            state.queue_changed()
            await entry.gate.opened.wait()
            self._streams.forget(entry.job.prompt_id)
            state.observers.job_stopped(entry.job)

    async def _attempt(
        self, entry: Running, resume: bool
    ) -> tuple[JobResult | None, dict[str, Any] | None]:
        """The lane's result, or None and why the lane failed."""
        lane, job = entry.lane, entry.job
        sink = self._sink_for(entry)
        try:
            if resume:
                result = await lane.resume(job, sink, entry.handle)
                if result is None:
                    return None, {"lane": lane.name, "error": "unknown after restart"}
                return result, None
            if lane.in_process:
                lease = self._state.lease
                entry.handle.may_proceed = lambda: lease.held  # by the clock (fencing.py)
                if not lease.held:
                    entry.handle.pause()  # claimed as the fence came: it waits with the rest
            return await lane.run(job, sink, entry.handle), None
        except Exception as exc:
            log.warning("lane %s failed running %s: %s", lane.name, job.prompt_id, exc)
            return None, {"lane": lane.name, "error": f"{type(exc).__name__}: {exc}"}

    def _sink_for(self, entry: Running) -> Callable[[EngineEvent], None]:
        job = entry.job
        lease = self._state.lease

        def sink(event: EngineEvent) -> None:
            # The done signal waits until the end is recorded (`Recorder.record` sends it).
            if (
                isinstance(event, Message)
                and event.type == "executing"
                and event.data["node"] is None
            ):
                return
            if entry.state is AttemptState.GIVING_BACK:
                return  # it runs again: its client sees that run, not this one's interruption
            deliver = functools.partial(entry.gate.pass_on, lambda: self._streams.event(job, event))
            if entry.lane.in_process and not lease.held:
                # Another gateway may run it by now: sent only if it turns out ours still.
                entry.hold_fenced(deliver)
                return
            if entry.fenced_events:
                entry.release_fenced()
            deliver()

        return sink


def _stop_if_refused(starting: asyncio.Future[Job | None], handle: LaneRun) -> None:
    if not starting.cancelled() and starting.exception() is None and starting.result() is None:
        handle.interrupt()
