"""The scheduler: admits jobs, feeds lane slots from the store, cancels exactly what is named.

Each lane slot runs a loop that claims the next eligible job from the store
when it is free, so order lives in one place (the store) and a job is never
held by a slot that cannot run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.lanes.base import Lane, LaneRun
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.store.base import JobStore, StoreError
from comfyfleet.store.records import Job, JobResult, JobStatus, NewJob

log = logging.getLogger(__name__)

#: Longest wait between attempts to record a job's end while the store refuses.
RECORD_RETRY_MAX = 2.0


class EventRouter(Protocol):
    """Where job events go (the server's WebSocket hub)."""

    def job_event(self, job: Job, event: EngineEvent) -> None: ...

    def job_finished(self, job: Job, status: JobStatus) -> None:
        """Called once the job's end is durably recorded."""

    def job_stopped(self, job: Job) -> None:
        """The job stopped running without an end recorded: it went back to the queue
        (or its end could not be written); nothing of it is current any more."""

    def queue_changed(self, remaining: int) -> None: ...


class QueueFull(Exception):
    """Admission refused: too many pending jobs."""

    def __init__(self, pending: int, retry_after: float) -> None:
        super().__init__(f"{pending} prompts are pending; try again later")
        self.pending = pending
        self.retry_after = retry_after


class EventGate:
    """Holds a job's events until the job before it on the same slot has sent its done
    signal, so a slot's clients see one prompt's end before the next one's first event
    (as from ComfyUI) while the next prompt already runs."""

    def __init__(self, after: asyncio.Future[Any] | None) -> None:
        self._held: list[Callable[[], None]] | None = None
        self.opened = asyncio.Event()
        if after is None or after.done():
            self.opened.set()
        else:
            self._held = []
            after.add_done_callback(lambda _f: self._open())

    def pass_on(self, deliver: Callable[[], None]) -> None:
        if self._held is None:
            deliver()
        else:
            self._held.append(deliver)

    def _open(self) -> None:
        held, self._held = self._held or [], None
        for deliver in held:
            deliver()
        self.opened.set()


@dataclass
class Running:
    job: Job
    lane: Lane
    gate: EventGate
    handle: LaneRun = field(default_factory=LaneRun)
    cancelled: bool = False  # cancel (not interrupt): the job ends as cancelled
    requeue: bool = False  # shutdown: back to pending instead of finishing


@dataclass
class _LaneSlots:
    lane: Lane
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    idle: set[asyncio.Task[Any]] = field(default_factory=set)  # slots waiting, holding no job
    retiring: bool = False
    busy: int = 0  # jobs running there now
    warmth: Warmth = field(default_factory=Warmth)  # what it ran last
    # Slots with nothing to claim, each waiting on its future: None to look again,
    # or a job `submit` claimed for it (the hand-off).
    parked: deque[asyncio.Future[Running | None]] = field(default_factory=deque)

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """While a slot waits holding no job, it may be cancelled at once."""
        task = asyncio.current_task()
        assert task is not None
        self.idle.add(task)
        try:
            yield
        finally:
            self.idle.discard(task)

    def free_for(self, job: Job) -> bool:
        return not self.retiring and self.busy < self.lane.slots and self.lane.can_run(job)


@dataclass
class _Slot:
    previous: asyncio.Task[None] | None = None  # the slot's last job, finishing
    idled: bool = False  # its last wait for work timed out


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
        self.router = router
        self.max_pending = max_pending
        self.retry = RetryPolicy(store, max_attempts)
        self.running: dict[str, Running] = {}
        self.pending = 0
        self._lanes = {lane.name: _LaneSlots(lane) for lane in lanes}
        # Read by `can_run` checks in the store's writer thread: replaced, never mutated.
        self._lane_snapshot: tuple[_LaneSlots, ...] = tuple(self._lanes.values())
        # Lanes a re-queued job should leave to others while another lane can run it.
        self._avoid: dict[str, frozenset[str]] = {}
        self._deferred = False
        self._wakes = 0  # counts `_wake` calls, so a slot notices one that came mid-claim
        self._submitting = 0  # submissions not yet counted in `pending`
        self._stopping = False
        self._resumes: set[asyncio.Task[None]] = set()
        self._settling: set[asyncio.Task[None]] = set()

    def include(self, lane: Lane) -> None:
        """Add a lane before `start` (at run time, use `add_lane`)."""
        if lane.name in self._lanes:
            raise ValueError(f"lane {lane.name} already exists")
        self._lanes[lane.name] = _LaneSlots(lane)
        self._lane_snapshot = tuple(self._lanes.values())

    @property
    def lanes(self) -> list[Lane]:
        return [entry.lane for entry in self._lanes.values()]

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        running, _ = await self.store.queue()
        for entry in self._lanes.values():
            await self._recover(entry.lane, [job for job in running if job.lane == entry.lane.name])
        self.pending = (await self.store.counts()).get(JobStatus.PENDING, 0)
        for entry in self._lanes.values():
            await self._start_lane(entry)

    async def _recover(self, lane: Lane, jobs: list[Job]) -> None:
        """Jobs recorded as running on `lane` when the gateway stopped."""
        if lane.in_process:
            requeued = await self.store.requeue_lane(lane.name)
            if requeued:
                log.info("re-queued %d jobs that were running on %s", len(requeued), lane.name)
            return
        for job in jobs:
            task = asyncio.create_task(self._resume(lane, job), name=f"resume-{job.prompt_id}")
            self._resumes.add(task)
            task.add_done_callback(self._resumes.discard)

    async def _start_lane(self, entry: _LaneSlots) -> None:
        await entry.lane.start()
        for slot in range(entry.lane.slots):
            name = f"{entry.lane.name}-slot-{slot}"
            entry.tasks.append(asyncio.create_task(self._slot_loop(entry), name=name))

    async def add_lane(self, lane: Lane) -> None:
        if lane.name in self._lanes:
            raise ValueError(f"lane {lane.name} already exists")
        entry = self._lanes[lane.name] = _LaneSlots(lane)
        self._lane_snapshot = tuple(self._lanes.values())
        await self._start_lane(entry)
        self._wake()

    async def remove_lane(self, name: str, timeout: float | None = None) -> None:
        """Stop giving the lane work, let its running jobs end (or re-queue them after
        `timeout`), then close it."""
        entry = self._lanes[name]
        entry.retiring = True
        await self._wind_down(entry.tasks, timeout, lambda r: r.lane is entry.lane)
        del self._lanes[name]
        self._lane_snapshot = tuple(self._lanes.values())
        await entry.lane.close()

    async def stop(self, grace: float, before_requeue: Callable[[], None] | None = None) -> None:
        """Stop claiming; let running jobs finish for `grace` seconds, then re-queue them
        (`before_requeue` is called first: what they started must outlive the process)."""
        self._stopping = True
        tasks = [t for entry in self._lanes.values() for t in entry.tasks] + list(self._resumes)
        await self._wind_down(tasks, grace, lambda _r: True, before_requeue)
        for entry in self._lanes.values():
            await entry.lane.close()

    async def _wind_down(
        self,
        tasks: list[asyncio.Task[None]],
        timeout: float | None,
        which: Any,
        before_requeue: Callable[[], None] | None = None,
    ) -> None:
        self._wake()
        winding = set(tasks)
        for slots in self._lanes.values():
            for idle in slots.idle & winding:
                idle.cancel()  # waiting for work or for its lane: nothing to finish
        live = [t for t in tasks if not t.done()]
        _, late = await asyncio.wait(live, timeout=timeout) if live else (set(), set())
        if late:
            if before_requeue is not None:
                before_requeue()
            for entry in self.running.values():
                if which(entry):
                    entry.requeue = True
                    entry.handle.interrupt()
            await asyncio.wait(late, timeout=max(timeout or 0.0, 5.0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Ends already reached are still written down before the store closes.
        if self._settling:
            await asyncio.wait(list(self._settling), timeout=30.0)

    @property
    def queue_remaining(self) -> int:
        return max(0, self.pending) + len(self.running)

    @property
    def waiting_slots(self) -> int:
        """Slots waiting for work right now: a new prompt goes straight to one of them."""
        return sum(len(entry.parked) for entry in self._lanes.values())

    def _queue_changed(self) -> None:
        self.router.queue_changed(self.queue_remaining)

    # -- admission ------------------------------------------------------------

    async def submit(self, new: NewJob) -> Job:
        if self._stopping:
            raise QueueFull(self.pending, retry_after=5.0)
        if self.pending >= self.max_pending:
            raise QueueFull(self.pending, retry_after=1.0)
        slot = self._idle_slot_for(new)
        if slot is not None:
            return await self._hand_off(new, *slot)
        self._submitting += 1
        try:
            job = await self.store.submit(new)
        finally:
            self._submitting -= 1
        self.pending += 1
        self._queue_changed()
        self._wake()
        return job

    def _idle_slot_for(
        self, new: NewJob
    ) -> tuple[_LaneSlots, asyncio.Future[Running | None]] | None:
        """A parked slot to give a new job straight to, when nothing else is queued or
        being queued: the job would be the next one claimed anyway. The warmest wins."""
        if self.pending > 0 or self._submitting:
            return None
        job = new.pending(0, 0.0)
        ready = [
            entry
            for entry in self._lane_snapshot
            if entry.parked and not entry.retiring and entry.lane.can_run(job)
        ]
        if not ready:
            return None
        entry = max(ready, key=lambda e: e.warmth.score(new.prompt))
        return entry, entry.parked.popleft()

    async def _hand_off(
        self, new: NewJob, entry: _LaneSlots, parked: asyncio.Future[Running | None]
    ) -> Job:
        """Queue the job as claimed by `entry`'s lane in one transaction (one commit fewer
        than queue-then-claim) and give it to the parked slot."""
        try:
            job = await self.store.submit(new, claim_for=entry.lane.name)
        except BaseException:
            if not parked.done():
                parked.set_result(None)  # the slot looks at the queue again
            raise
        running = Running(job, entry.lane, EventGate(None))
        if parked.done():  # the slot was stopped meanwhile: the job goes to the queue
            await self._give_back(job, None)
        else:
            self.running[job.prompt_id] = running  # cancellable from here on
            parked.set_result(running)
            self._queue_changed()
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

    def wake(self) -> None:
        """Idle slots look at the queue again (a lane became able to run more)."""
        self._wake()

    def _wake(self) -> None:
        self._wakes += 1
        for entry in self._lanes.values():
            while entry.parked:
                parked = entry.parked.popleft()
                if not parked.done():
                    parked.set_result(None)

    def _forget_pending(self, count: int) -> None:
        if count:
            self.pending -= count
            self._queue_changed()

    # -- dispatch -------------------------------------------------------------

    async def _slot_loop(self, entry: _LaneSlots) -> None:
        slot = _Slot()
        while not (self._stopping or entry.retiring):
            try:
                await self._take_one(entry, slot)
            except Exception:
                # A store failure must not cost the lane a slot; the job, if any, stays
                # running in the store and is recovered at the next start.
                log.exception("slot of lane %s failed; retrying", entry.lane.name)
                await asyncio.sleep(1.0)

    async def _take_one(self, entry: _LaneSlots, slot: _Slot) -> None:
        """Claim and start the next job while the previous one's end is still being
        written; the new job's events wait for the previous done signal (EventGate)."""
        lane = entry.lane
        async with entry.waiting():  # holding no job: a retiring lane may cancel it here
            await lane.wait_ready()
        wakes = self._wakes
        job = None
        # With nothing pending the claim would find nothing: park at once (a submit hands
        # its job over). After an idle second, claim anyway, should the count be off.
        if self.pending > 0 or slot.idled:
            self._deferred = False
            job = await self.store.claim(lane.name, lambda job: self._eligible(entry, job))
            if self._deferred:
                self._wake()  # a warmer free lane should take what this one left
        slot.idled = False
        if job is not None:
            # Not clamped: a claim can land before its submit's increment; they net out.
            self.pending -= 1
            slot.previous = await self._run(lane, job, after=slot.previous)
        elif wakes == self._wakes:  # nothing new since the queue was looked at: wait
            handed = await self._park(entry)
            if handed is None:
                slot.idled = wakes == self._wakes  # timed out, not woken
            else:
                slot.previous = await self._run(lane, handed.job, after=slot.previous, entry=handed)

    async def _park(self, entry: _LaneSlots) -> Running | None:
        """Wait (a second at most) for a wake-up, or for a job `submit` hands over."""
        parked: asyncio.Future[Running | None] = asyncio.get_running_loop().create_future()
        entry.parked.append(parked)
        try:
            async with entry.waiting():
                return await asyncio.wait_for(asyncio.shield(parked), timeout=1.0)
        except TimeoutError:
            if parked in entry.parked:
                entry.parked.remove(parked)
                return None
            return await parked  # a submit took this slot: its commit is under way
        except asyncio.CancelledError:
            if parked in entry.parked:
                entry.parked.remove(parked)
            parked.cancel()  # a hand-off under way sends its job back to the queue
            raise

    def _eligible(self, entry: _LaneSlots, job: Job) -> bool:
        """Whether this lane should take the job (runs in the store's writer thread)."""
        if entry.retiring or not entry.lane.can_run(job):
            return False
        avoid = self._avoid.get(job.prompt_id)
        if avoid and entry.lane.name in avoid:
            others = [o for o in self._lane_snapshot if o.lane.name not in avoid]
            if any(not o.retiring and o.lane.can_run(job) for o in others):
                return False
        # Affinity: leave the job to another lane that is free right now and warmer, but
        # not to one the job avoids (it would leave the job too, and no lane would take it).
        rivals = [
            other
            for other in self._lane_snapshot
            if other is not entry
            and not (avoid and other.lane.name in avoid)
            and other.free_for(job)
        ]
        if not rivals:
            return True  # the common case (one lane, or the others busy): no scoring
        mine = entry.warmth.score(job.prompt)
        if any(other.warmth.score(job.prompt) > mine for other in rivals):
            self._deferred = True  # wake the others once this claim returns
            return False
        return True

    async def _run(
        self,
        lane: Lane,
        job: Job,
        *,
        resume: bool = False,
        after: asyncio.Task[None] | None = None,
        entry: Running | None = None,
    ) -> asyncio.Task[None]:
        """Run one attempt until the lane's slot is free again: the attempt ended, or the
        lane released the slot early. What is left (reading the result, recording the end)
        goes on in the task returned, so the slot claims its next job meanwhile."""
        if entry is None:
            entry = Running(job, lane, EventGate(after))
        else:
            entry.gate = EventGate(after)  # handed over: nothing has run yet
        self.running[job.prompt_id] = entry
        slots = self._lanes.get(lane.name)
        if slots is not None:
            slots.busy += 1
            slots.warmth = Warmth.of(job.prompt)
        self._queue_changed()
        finishing = asyncio.create_task(self._finish(entry, resume), name=f"run-{job.prompt_id}")
        try:
            await entry.handle.released.wait()  # set early by the lane, or by `_finish`
        except asyncio.CancelledError:
            # Stopped mid-run: the job stays running in the store; the next start
            # recovers it (re-queued, or asked after on its backend).
            finishing.cancel()
            await asyncio.wait([finishing])
            if self.running.get(job.prompt_id) is entry:
                del self.running[job.prompt_id]
            raise
        finally:
            if slots is not None:
                slots.busy -= 1
        self._settling.add(finishing)
        finishing.add_done_callback(self._settling.discard)
        return finishing

    async def _finish(self, entry: Running, resume: bool) -> None:
        try:
            result, failure = await self._attempt(entry.lane, entry.job, entry, resume)
        except BaseException:
            self.running.pop(entry.job.prompt_id, None)
            self._queue_changed()
            raise
        finally:
            entry.handle.release()  # the lane is done: its slot takes the next job meanwhile
        await self._record(entry, result, failure)

    async def _resume(self, lane: Lane, job: Job) -> None:
        await asyncio.wait([await self._run(lane, job, resume=True)])

    async def _attempt(
        self, lane: Lane, job: Job, entry: Running, resume: bool
    ) -> tuple[JobResult | None, dict[str, Any] | None]:
        """The lane's result, or None and why the lane failed."""
        sink = self._sink_for(entry)
        try:
            if resume:
                result = await lane.resume(job, sink, entry.handle)
                if result is None:
                    return None, {"lane": lane.name, "error": "unknown after restart"}
                return result, None
            return await lane.run(job, sink, entry.handle), None
        except Exception as exc:
            log.warning("lane %s failed running %s: %s", lane.name, job.prompt_id, exc)
            return None, {"lane": lane.name, "error": f"{type(exc).__name__}: {exc}"}

    async def _record(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> None:
        job = entry.job
        finished: JobStatus | None = None
        try:
            finished = await self._settle_retrying(entry, result, failure)
        except Exception:
            # The job stays running in the store and is recovered at the next start.
            log.exception("could not record the end of %s", job.prompt_id)
        finally:
            self.running.pop(job.prompt_id, None)
            self._queue_changed()
        await entry.gate.opened.wait()  # after the previous job's done signal
        if finished is not None:
            self.router.job_finished(job, finished)
        else:
            self.router.job_stopped(job)

    async def _settle_retrying(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> JobStatus | None:
        """Record the end, retrying while the store refuses (a full disk, say): the failed
        write was rolled back and the writes are fenced by attempt, so a retry is safe.
        Gives up only when the scheduler stops (the next start recovers the job)."""
        delay = 0.25
        while True:
            try:
                return await self._settle(entry, result, failure)
            except StoreError as exc:
                if self._stopping:
                    raise
                log.warning(
                    "could not record the end of %s (%s); retrying", entry.job.prompt_id, exc
                )
                await asyncio.sleep(delay)
                delay = min(RECORD_RETRY_MAX, delay * 2)

    def _sink_for(self, entry: Running) -> Any:
        job = entry.job

        def deliver(event: EngineEvent) -> None:
            # A job being handed back at shutdown is not over: it runs again later.
            interrupted = isinstance(event, Message) and event.type == "execution_interrupted"
            if interrupted and entry.requeue:
                return
            self.router.job_event(job, event)

        def sink(event: EngineEvent) -> None:
            # The done signal waits until the end is recorded (job_finished sends it).
            if (
                isinstance(event, Message)
                and event.type == "executing"
                and event.data["node"] is None
            ):
                return
            entry.gate.pass_on(lambda: deliver(event))

        return sink

    async def _settle(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> JobStatus | None:
        """Record how the attempt ended; None when the job went back to the queue."""
        job = entry.job
        if entry.requeue and not entry.cancelled:
            await self._give_back(job, None)
            return None
        if not entry.cancelled:
            decision = await self.retry.decide(job, entry.lane, result, failure)
            if decision.requeue:
                await self._give_back(job, decision.reason)
                return None
            result = decision.result
        assert result is not None or entry.cancelled
        if entry.cancelled:
            messages = result.messages if result else []
            error = result.error if result else None
            result = JobResult(JobStatus.CANCELLED, {}, {}, messages, error, [])
        assert result is not None
        self._avoid.pop(job.prompt_id, None)
        if await self.store.finish(job.prompt_id, job.attempt, result):
            return result.status
        return None

    async def _give_back(self, job: Job, reason: dict[str, Any] | None) -> None:
        if reason and reason.get("lane"):
            self._avoid[job.prompt_id] = self._avoid.get(job.prompt_id, frozenset()) | {
                reason["lane"]
            }
        if await self.store.requeue(job.prompt_id, job.attempt, reason):
            self.pending += 1
            self._wake()
