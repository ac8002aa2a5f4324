"""The scheduler: admits jobs, feeds lane slots from the store, cancels exactly what is named.

Each lane slot runs a loop that claims the next eligible job from the store
when it is free, so order lives in one place (the store) and a job is never
held by a slot that cannot run it.

A slot of a remote lane, once its backend has queued its prompt, reserves its
next job in the store (still pending, set aside for that lane). When the
backend reports the prompt's end, that job is submitted at once while its start
is recorded: the claim commit is off the hand-over path. Reservations never
hold a job back: a slot that frees up with none of its own takes another
lane's, one that has waited long takes any free slot, and a job submitted
ahead of a reserved one in queue order sends the reservation back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from comfyfleet.domain.gateways import DEFAULT_LEASE
from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob
from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.lanes.base import Lane, LaneRun
from comfyfleet.logs import tag_job
from comfyfleet.scheduler.attempts import AttemptState, EventGate, Running
from comfyfleet.scheduler.observers import JobObserver, Observers
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.scheduler.streams import PromptStreams
from comfyfleet.store.base import JobStore, StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest wait between attempts to record a job's end while the store refuses.
RECORD_RETRY_MAX = 2.0
#: A reservation that has waited this many times as long as a slot's last run goes to
#: that slot even if it has one of its own: no job waits long behind a long prompt.
RESERVATION_PATIENCE = 1.5
#: How deep into the queue a claim or reservation looks for a job its lane should take.
CLAIM_DEPTH = 64
#: The first page of candidates is small: the first job nearly always fits, and a page
#: of thousands of prompts would be decoded for nothing.
FIRST_PAGE = 4


class Verdict(enum.Enum):
    """What a lane makes of a candidate."""

    TAKE = "take"
    PASS = "pass"  # not for this lane
    LEAVE = "leave"  # for another lane, free now, that starts it sooner or is warmer


class QueueFull(Exception):
    """Admission refused: too many pending jobs."""

    def __init__(self, pending: int, retry_after: float) -> None:
        super().__init__(f"{pending} prompts are pending; try again later")
        self.pending = pending
        self.retry_after = retry_after


@dataclass
class _LaneSlots:
    lane: Lane
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    idle: set[asyncio.Task[Any]] = field(default_factory=set)  # slots waiting, holding no job
    retiring: bool = False
    busy: int = 0  # jobs running there now
    warmth: Warmth = field(default_factory=Warmth)  # what it ran last
    # Slots with nothing to claim, each waiting for a wake-up or for a job `submit`
    # claimed for it and started there (the hand-off).
    parked: deque[_Parked] = field(default_factory=deque)
    # Slots whose backend has queued their prompt: each may set its next job aside.
    accepted: set[_Slot] = field(default_factory=set)

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

    @property
    def would_queue(self) -> bool:
        """A job it takes now would wait in its backend's queue (a prefetch slot)."""
        return self.busy >= self.lane.runs_at_once


@dataclass(eq=False)  # one per slot task, kept in sets by identity
class _Slot:
    previous: asyncio.Task[None] | None = None  # the slot's last job, finishing
    idled: bool = False  # its last wait for work timed out
    reserving: asyncio.Task[None] | None = None  # setting its next job aside
    last_run: float = 0.0  # how long its last job kept it busy (s)


@dataclass(eq=False)
class _Parked:
    """A slot waiting for work: `started` gets None to look at the queue again, or the
    run of a job handed over (already started, so its submit is not held up by the
    slot's own wake-up)."""

    slot: _Slot
    started: asyncio.Future[_Started | None]
    task: asyncio.Task[Any]  # the slot's own


@dataclass(frozen=True)
class _Started:
    entry: Running
    finishing: asyncio.Task[None]  # the attempt, then the recording of its end


@dataclass
class _Reservation:
    job: Job  # pending in the store, set aside for `owner` (job.lane)
    owner: _LaneSlots
    since: float  # time.monotonic() when it was made


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        lanes: Sequence[Lane],
        *observers: JobObserver,
        max_pending: int = 10_000,
        max_attempts: int = 3,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        self.store = store
        self.observers = Observers(*observers)  # told what happens to each job
        self.streams = PromptStreams(self.observers)
        self.max_pending = max_pending
        self.retry = RetryPolicy(store, max_attempts)
        self._running: dict[str, Running] = {}
        self.pending = 0
        self._lanes = {lane.name: _LaneSlots(lane) for lane in lanes}
        # Lanes a re-queued job should leave to others while another lane can run it.
        self._avoid: dict[str, frozenset[str]] = {}
        self._taking: set[str] = set()  # candidates a slot here is claiming or reserving
        self._wakes = 0  # counts `_wake` calls, so a slot notices one that came mid-claim
        self._submitting = 0  # submissions not yet counted in `pending`
        self._stopping = False
        self._resumes: set[asyncio.Task[None]] = set()
        self._settling: set[asyncio.Task[None]] = set()
        # Jobs set aside for busy remote lanes (still pending in the store), by id.
        self._reserved: dict[str, _Reservation] = {}
        self._reserving: set[asyncio.Task[None]] = set()
        self.lease = lease  # this gateway's lease on its jobs (`store.join` made it)
        self._keeper: asyncio.Task[None] | None = None

    def include(self, lane: Lane) -> None:
        """Add a lane before `start` (at run time, use `add_lane`)."""
        if lane.name in self._lanes:
            raise ValueError(f"lane {lane.name} already exists")
        self._lanes[lane.name] = _LaneSlots(lane)

    @property
    def lanes(self) -> list[Lane]:
        return [entry.lane for entry in self._lanes.values()]

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        running, pending = await self.store.queue()
        # Of what the store holds, this gateway's own (from before a restart) and orphans:
        # never another live gateway's.
        orphans = {job.prompt_id for job in await self.store.orphaned()}

        def ours(job: Job) -> bool:
            return job.owner == self.store.owner or job.prompt_id in orphans

        running = [job for job in running if ours(job)]
        running += await self._recover_reserved([j for j in pending if j.lane and ours(j)])
        await self._recall_avoided([job for job in pending if job.attempt > 0])
        for entry in self._lanes.values():
            await self._recover(entry.lane, [job for job in running if job.lane == entry.lane.name])
        self.pending = (await self.store.counts()).get(JobStatus.PENDING, 0)
        for entry in self._lanes.values():
            await self._start_lane(entry)
        await self.store.watch_work(self._work_elsewhere)
        self._keeper = asyncio.create_task(self._keep_lease(), name="lease")

    async def _recover(self, lane: Lane, jobs: list[Job]) -> None:
        """Jobs recorded as running on `lane` when the gateway stopped."""
        if lane.in_process:
            requeued = await self.store.requeue_lane(lane.name)
            if requeued:
                log.info("re-queued %d jobs that were running on %s", len(requeued), lane.name)
            return
        for job in jobs:
            # Another gateway's (it died): this one's now, the old owner fenced out.
            adopted = job if job.owner == self.store.owner else await self.store.adopt(job)
            if adopted is not None:
                self._follow(lane, adopted)

    async def _recall_avoided(self, requeued: list[Job]) -> None:
        """Re-queued jobs keep leaving the lanes they were given back from (failed there,
        or taken back from there) across a restart: the reasons are in the store."""
        notes_of = await self.store.attempt_notes_of([job.prompt_id for job in requeued])
        for prompt_id, notes in notes_of.items():
            lanes = frozenset(note["lane"] for _, note in notes if note.get("lane"))
            if lanes:
                self._avoid[prompt_id] = lanes

    async def _recover_reserved(self, jobs: list[Job]) -> list[Job]:
        """Jobs reserved when the gateway stopped: one may have been submitted to its
        lane's backend before its start was recorded, so each is treated as running
        there (and asked after); those of lanes that are gone go back to the queue."""
        running, back = [], []
        for job in jobs:
            entry = self._lanes.get(job.lane or "")
            started = None
            if entry is not None and not entry.lane.in_process:
                started = await self.store.start_reserved(job, entry.lane.name)
            if started is not None:
                running.append(started)
            else:
                back.append(job.prompt_id)
        await self.store.unreserve(back)
        return running

    async def _start_lane(self, entry: _LaneSlots) -> None:
        await entry.lane.start(functools.partial(self._adopt, entry.lane))
        for slot in range(entry.lane.slots):
            name = f"{entry.lane.name}-slot-{slot}"
            entry.tasks.append(asyncio.create_task(self._slot_loop(entry), name=name))

    async def _adopt(self, lane: Lane, found: Sequence[str]) -> set[str]:
        """Of the prompts `lane`'s backend holds for this gateway, those to stay there:
        the jobs running there (or set aside for it), and re-queued jobs no other lane
        has taken since, started on `lane` now and followed there (not run twice)."""
        keep: set[str] = set()
        for prompt_id in found:
            running = self._running.get(prompt_id)
            job = running.job if running is not None else await self.store.get(prompt_id)
            if job is None or job.lane not in (None, lane.name):
                continue
            if job.status == JobStatus.RUNNING:
                keep.add(prompt_id)
            elif job.status == JobStatus.PENDING and prompt_id not in self._running:
                started = await self.store.start_reserved(job, lane.name)
                if started is not None:
                    keep.add(prompt_id)
                    self._reserved.pop(prompt_id, None)
                    self._avoid.pop(prompt_id, None)
                    self.pending -= 1
                    self._follow(lane, started)
        return keep

    def _follow(self, lane: Lane, job: Job) -> None:
        """Follow a job already on `lane`'s backend (found there, not submitted now)."""
        task = asyncio.create_task(self._resume(lane, job), name=f"resume-{job.prompt_id}")
        self._resumes.add(task)
        task.add_done_callback(self._resumes.discard)

    async def add_lane(self, lane: Lane) -> None:
        if lane.name in self._lanes:
            raise ValueError(f"lane {lane.name} already exists")
        entry = self._lanes[lane.name] = _LaneSlots(lane)
        await self._start_lane(entry)
        self._wake()

    async def remove_lane(self, name: str, timeout: float | None = None) -> None:
        """Stop giving the lane work, let its running jobs end (or re-queue them after
        `timeout`), then close it."""
        entry = self._lanes[name]
        entry.retiring = True
        await self._wind_down(entry.tasks, timeout, lambda r: r.lane is entry.lane)
        await self._return_reservations(lambda r: r.owner is entry, settle=True)
        del self._lanes[name]
        await entry.lane.close()

    async def stop(self, grace: float, before_requeue: Callable[[], None] | None = None) -> None:
        """Stop claiming; let running jobs finish for `grace` seconds, then re-queue them
        (`before_requeue` is called first: what they started must outlive the process)."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        tasks = [t for entry in self._lanes.values() for t in entry.tasks] + list(self._resumes)
        await self._wind_down(tasks, grace, lambda _r: True, before_requeue)
        await self._return_reservations(lambda _r: True, settle=True)
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
            for entry in self._running.values():
                if which(entry) and entry.to(AttemptState.GIVING_BACK):
                    entry.handle.interrupt()
            await asyncio.wait(late, timeout=max(timeout or 0.0, 5.0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Ends already reached are still written down before the store closes.
        if self._settling:
            await asyncio.wait(list(self._settling), timeout=30.0)

    def running_jobs(self) -> list[Job]:
        """The jobs running now (or handed to their lane a moment ago), each with its lane."""
        return [run.job for run in self._running.values()]

    def running_job(self, prompt_id: str) -> Job | None:
        run = self._running.get(prompt_id)
        return run.job if run is not None else None

    @property
    def queue_remaining(self) -> int:
        return max(0, self.pending) + len(self._running)

    @property
    def waiting_slots(self) -> int:
        """Slots waiting for work right now: a new prompt goes straight to one of them."""
        return sum(len(entry.parked) for entry in self._lanes.values())

    def _queue_changed(self) -> None:
        self.observers.queue_changed(self.queue_remaining)

    # -- several gateways ---------------------------------------------------------

    def _work_elsewhere(self, owner: str) -> None:
        """Another gateway queued (or gave back) a job: idle slots here look too. It is
        counted until the next recount, whoever claims it."""
        if owner != self.store.owner and not self._stopping:
            self.pending += 1
            self._wake()

    async def _keep_lease(self) -> None:
        """Renew this gateway's lease; take over what gateways whose lease ran out left."""
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                if not await self.store.heartbeat(self.lease):
                    log.error(
                        "gateway id %s is now another process's: give each gateway an id "
                        "of its own (--gateway-id)",
                        self.store.owner,
                    )
                live = await self.store.gateways()
                await self._take_over(await self.store.orphaned())
                if len(live) > 1:  # the others' submits and claims count too
                    self.pending = (await self.store.counts()).get(JobStatus.PENDING, 0)
            except StoreError as exc:
                log.warning("could not renew the lease of gateway %s: %s", self.store.owner, exc)

    async def _take_over(self, orphans: list[Job]) -> None:
        """Jobs of gateways that are gone: a run on a lane of this gateway's kind is
        re-queued (in-process) or adopted and followed (a backend's), a reservation
        given back. A lane this gateway does not have is left to one that has it."""
        for job in orphans:
            if job.owner == self.store.owner or job.prompt_id in self._running:
                continue
            if job.status == JobStatus.PENDING:
                await self._unreserve([job.prompt_id])
                continue
            entry = self._lanes.get(job.lane or "")
            if entry is None or entry.retiring:
                continue
            if entry.lane.in_process:
                if await self.store.requeue_orphaned(job):
                    log.info("re-queued %s: gateway %s is gone", job.prompt_id, job.owner)
                    self.pending += 1
                    self.observers.job_requeued(job, {"kind": "orphaned", "from": job.owner})
                    self._wake()
            elif (adopted := await self.store.adopt(job)) is not None:
                log.info("following %s: gateway %s is gone", job.prompt_id, job.owner)
                self._follow(entry.lane, adopted)

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
        self.observers.job_submitted(job)
        self._queue_changed()
        self._wake()
        self._make_way_for(job)
        self._reserve_ahead()
        return job

    def _idle_slot_for(self, new: NewJob) -> tuple[_LaneSlots, _Parked] | None:
        """A parked slot to give a new job straight to, when nothing else is queued or
        being queued: the job would be the next one claimed anyway. The warmest wins."""
        if self.pending > 0 or self._submitting:
            return None
        job = new.pending(0, 0.0)
        ready = [
            entry
            for entry in self._lanes.values()
            if entry.parked and not entry.retiring and entry.lane.can_run(job)
        ]
        if not ready:
            return None
        # One that starts it at once, then the warmest.
        entry = max(ready, key=lambda e: (not e.would_queue, e.warmth.score(new.prompt)))
        return entry, entry.parked.popleft()

    async def _hand_off(self, new: NewJob, entry: _LaneSlots, parked: _Parked) -> Job:
        """Queue the job as claimed by `entry`'s lane in one transaction (one commit fewer
        than queue-then-claim), start it on the parked slot's behalf and give it the run."""
        try:
            job = await self.store.submit(new, claim_for=entry.lane.name)
        except BaseException:
            if not parked.started.done():
                parked.started.set_result(None)  # the slot looks at the queue again
            raise
        self.observers.job_submitted(job)
        if parked.started.done():  # the slot was stopped meanwhile: the job goes to the queue
            await self._give_back(job, None)
        else:
            # Started here, not by the slot once it wakes: in a burst of submits every
            # hop through the event loop waits behind all the other requests.
            parked.started.set_result(self._start(entry.lane, job, parked.slot))
            # It holds a job now, though its task has not woken yet: a lane retiring
            # meanwhile must wait for it, not cancel it as idle.
            entry.idle.discard(parked.task)
            # ComfyUI sends two `status` frames as a prompt starts at once: queued, then
            # taken by its worker; `_start` sent the second.
            self._queue_changed()
        return job

    # -- cancellation ---------------------------------------------------------

    def interrupt(self, prompt_id: str | None = None) -> list[str]:
        """Interrupt one running job, or every running job when no id is given."""
        targets = [prompt_id] if prompt_id is not None else list(self._running)
        hit = [t for t in targets if t in self._running]
        for target in hit:
            self._running[target].handle.interrupt()
        return hit

    async def delete_pending(self, prompt_ids: Sequence[str]) -> list[str]:
        # A reserved job started a moment ago is pending in the store until its start is
        # recorded: it is running, and only `cancel` stops it.
        prompt_ids = [p for p in prompt_ids if p not in self._running]
        for prompt_id in prompt_ids:
            self._reserved.pop(prompt_id, None)
        removed = await self.store.cancel(prompt_ids, pending_only=True)
        self._forget_pending(removed)
        return removed

    async def clear_pending(self) -> list[str]:
        self._reserved.clear()
        removed = await self.store.cancel_all_pending()
        self._forget_pending(removed)
        return removed

    async def cancel(self, prompt_ids: Sequence[str]) -> list[str]:
        """Cancel pending or running jobs; a running one is interrupted and ends cancelled."""
        cancelled = await self.delete_pending([p for p in prompt_ids if p not in self._running])
        for prompt_id in prompt_ids:
            entry = self._running.get(prompt_id)
            if entry is not None:
                entry.to(AttemptState.CANCELLING)
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
                if not parked.started.done():
                    parked.started.set_result(None)

    def _forget_pending(self, removed: list[str]) -> None:
        for prompt_id in removed:
            self.streams.forget(prompt_id)
            self._avoid.pop(prompt_id, None)
        if removed:
            self.pending -= len(removed)
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
        if slot.reserving is not None and not slot.reserving.done():
            await asyncio.wait([slot.reserving])  # a reservation being made lands first
        await self._return_reservations(
            lambda r: r.owner is entry and not self._may_take(entry, r.job)
        )
        async with entry.waiting():  # holding no job: a retiring lane may cancel it here
            await lane.wait_ready()
        reserved = self._pick_reserved(entry, slot)
        if reserved is not None:
            await self._take_reserved(entry, slot, reserved)
            return
        wakes = self._wakes
        job = None
        # With nothing pending the claim would find nothing: park at once (a submit hands
        # its job over). After an idle second, claim anyway, should the count be off.
        if self.pending > 0 or slot.idled:
            job, left = await self._take_first(
                lambda job: self._eligible(entry, job),
                lambda job: self.store.claim_job(job, lane.name),
            )
            if left:
                self._wake()  # a warmer (or sooner) free lane should take what this one left
        slot.idled = False
        if job is not None:
            # Not clamped: a claim can land before its submit's increment; they net out.
            self.pending -= 1
            await self._run(lane, job, slot)
        elif wakes == self._wakes:  # nothing new since the queue was looked at: wait
            if await self._take_back_for(entry):
                return  # it is about to be queued again: claim it
            handed = await self._park(entry, slot)
            if handed is None:
                slot.idled = wakes == self._wakes  # timed out, not woken
            else:
                await self._until_released(handed, slot)

    # -- taking back -------------------------------------------------------------

    async def _take_back_for(self, entry: _LaneSlots) -> bool:
        """A free slot with nothing to claim takes back a prompt that waits in another
        backend's queue behind a running one (prefetch), the earliest in queue order, if
        it can start it at once (its own backend is idle). True when one was taken
        back: it is about to be queued again."""
        if entry.would_queue:
            return False  # it would only wait in this backend's queue instead
        started = {r.lane for r in self._running.values() if _runs_there(r)}
        waiting = [
            r
            for r in self._running.values()
            if r.lane in started
            and r.lane is not entry.lane
            and r.handle.take_back is not None
            and r.handle.queued_there()
            and r.state is AttemptState.RUNNING
            and self._may_take(entry, r.job)
        ]
        if not waiting:
            return False
        chosen = min(waiting, key=lambda r: r.job.dispatch_key())
        assert chosen.handle.take_back is not None
        chosen.to(AttemptState.TAKING_BACK)  # no other slot chooses it meanwhile
        try:
            if await chosen.handle.take_back():
                return True
        except Exception:
            log.exception("could not take %s back", chosen.job.prompt_id)
        chosen.to(AttemptState.RUNNING)  # still there: it runs there after all
        return False

    # -- reservations -----------------------------------------------------------

    def runs_on(self, lane: str) -> list[str]:
        """Prompt ids running on a lane (its backend has them, or is about to)."""
        return sorted(p for p, run in self._running.items() if run.lane.name == lane)

    def reserved_for(self, lane: str) -> list[str]:
        """Prompt ids set aside for a lane, in queue order."""
        mine = [r.job for r in self._reserved.values() if r.owner.lane.name == lane]
        return [job.prompt_id for job in sorted(mine, key=Job.dispatch_key)]

    def _may_take(self, entry: _LaneSlots, job: Job) -> bool:
        return not entry.retiring and entry.lane.can_run(job) and not self._avoided(entry, job)

    def _pick_reserved(self, entry: _LaneSlots, slot: _Slot) -> _Reservation | None:
        """The reservation a free slot starts next, taken out of the pool: its lane's
        earliest, unless another lane's (which this one can run) is due first, because
        this lane has none or because it has waited long."""
        mine = others = None
        for reservation in self._reserved.values():
            if not self._may_take(entry, reservation.job):
                continue
            key = reservation.job.dispatch_key()
            if reservation.owner is entry:
                if mine is None or key < mine.job.dispatch_key():
                    mine = reservation
            elif others is None or key < others.job.dispatch_key():
                others = reservation
        chosen = mine
        if others is not None and (
            mine is None
            or (
                others.job.dispatch_key() < mine.job.dispatch_key()
                and time.monotonic() - others.since > RESERVATION_PATIENCE * slot.last_run
            )
        ):
            chosen = others
        if chosen is not None:
            del self._reserved[chosen.job.prompt_id]
        return chosen

    async def _take_reserved(self, entry: _LaneSlots, slot: _Slot, taken: _Reservation) -> None:
        lane = entry.lane
        if taken.owner is entry:
            # Set aside for this lane already: the backend gets it while its start is
            # recorded (a restart asks that backend about any reservation it finds).
            self.pending -= 1
            job = replace(
                taken.job,
                status=JobStatus.RUNNING,
                attempt=taken.job.attempt + 1,
                lane=lane.name,
                started_at=time.time(),
            )
            await self._run(lane, job, slot, reserved=taken.job)
            return
        # Another lane's: recorded as running here first, so a restart asks this backend.
        try:
            started = await self.store.start_reserved(taken.job, lane.name)
        except BaseException:
            self._reserved[taken.job.prompt_id] = taken  # still set aside in the store
            raise
        if started is not None:
            self.pending -= 1
            self._reserve_ahead()  # its lane may set another aside
            await self._run(lane, started, slot)

    def _accepted(self, entry: _LaneSlots, slot: _Slot, handle: LaneRun) -> None:
        if not handle.released.is_set():
            entry.accepted.add(slot)
            self._reserve_ahead()

    def _reserve_ahead(self) -> None:
        """A backend queued a slot's prompt, work arrived, or a reservation went
        elsewhere: busy slots whose backend has their prompt set their next job aside."""
        if self.pending - len(self._reserved) <= 0:
            return
        held = Counter(r.owner.lane.name for r in self._reserved.values())
        for entry in self._lanes.values():
            for slot in entry.accepted:
                self._reserve_soon(entry, slot, held[entry.lane.name])

    def _reserve_soon(self, entry: _LaneSlots, slot: _Slot, held: int) -> None:
        """Set the slot's next job aside (it holds `held` already), if there is one no
        free slot is about to take."""
        if self._stopping or entry.retiring:
            return
        if slot.reserving is not None and not slot.reserving.done():
            return
        if self.pending - len(self._reserved) <= 0 or entry.busy < entry.lane.slots:
            return
        if held >= entry.lane.slots:
            return
        task = asyncio.create_task(self._reserve(entry), name=f"reserve-{entry.lane.name}")
        slot.reserving = task
        self._reserving.add(task)
        task.add_done_callback(self._reserving.discard)

    async def _reserve(self, entry: _LaneSlots) -> None:
        try:
            job, _ = await self._take_first(
                lambda j: self._reservable(entry, j),
                lambda j: self.store.reserve_job(j, entry.lane.name),
            )
        except StoreError as exc:
            log.info("could not reserve a job for %s: %s", entry.lane.name, exc)
            return
        if job is not None:
            self._reserved[job.prompt_id] = _Reservation(job, entry, time.monotonic())

    def _reservable(self, entry: _LaneSlots, job: Job) -> Verdict:
        """Whether a busy lane sets the job aside: one a free lane could take now is
        left to it."""
        if not self._may_take(entry, job):
            return Verdict.PASS
        if any(o is not entry and o.free_for(job) for o in self._lanes.values()):
            return Verdict.PASS  # its slot takes it without a wake-up
        return Verdict.TAKE

    def _make_way_for(self, job: Job) -> None:
        """A new job ahead of reserved ones in queue order: those whose lane could run it
        go back to the queue, so it starts first."""
        key = job.dispatch_key()
        behind = [
            r
            for r in self._reserved.values()
            if key < r.job.dispatch_key() and r.owner.lane.can_run(job)
        ]
        if behind:
            task = asyncio.create_task(self._unreserve(self._set_free(behind)))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def _return_reservations(
        self, which: Callable[[_Reservation], bool], *, settle: bool = False
    ) -> None:
        if settle and self._reserving:  # reservations being made count too
            await asyncio.wait(list(self._reserving))
        await self._unreserve(self._set_free([r for r in self._reserved.values() if which(r)]))

    def _set_free(self, reservations: list[_Reservation]) -> list[str]:
        """Out of the pool at once (no slot takes them now); `_unreserve` tells the store."""
        return [r.job.prompt_id for r in reservations if self._reserved.pop(r.job.prompt_id, None)]

    async def _unreserve(self, ids: list[str]) -> None:
        if ids:
            await self.store.unreserve(ids)
            self._wake()

    async def _park(self, entry: _LaneSlots, slot: _Slot) -> _Started | None:
        """Wait (a second at most) for a wake-up, or for a job `submit` hands over."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        parked = _Parked(slot, loop.create_future(), task)
        entry.parked.append(parked)
        # Awaited directly (no wait_for): a hand-off reaches the slot in one loop pass.
        timer = loop.call_later(1.0, _unpark, entry, parked)
        try:
            async with entry.waiting():
                return await parked.started  # a cancel here cancels it: see _hand_off
        except asyncio.CancelledError:
            if parked in entry.parked:
                entry.parked.remove(parked)
            handed = parked.started
            if handed.done() and not handed.cancelled() and (run := handed.result()) is not None:
                await self._abandon(run, slot)  # handed over a moment ago
            raise
        finally:
            timer.cancel()

    def _avoided(self, entry: _LaneSlots, job: Job) -> bool:
        """A re-queued job leaves the lanes it failed on to any other lane that can run it."""
        avoid = self._avoid.get(job.prompt_id)
        if not avoid or entry.lane.name not in avoid:
            return False
        others = [o for o in self._lanes.values() if o.lane.name not in avoid]
        return any(not o.retiring and o.lane.can_run(job) for o in others)

    async def _take_first(
        self,
        choose: Callable[[Job], Verdict],
        take: Callable[[Job], Awaitable[Job | None]],
    ) -> tuple[Job | None, bool]:
        """The first candidate in queue order that `choose` takes, once `take` (a fenced
        claim or reservation) got it, and whether `choose` left any to another lane.
        A candidate lost to a race (another gateway, a cancel) is passed by; one that
        another slot here is taking is left to it."""
        left = False
        after: Job | None = None
        # Past the jobs other slots here are taking: those are likely first in line.
        looked, limit = 0, FIRST_PAGE + len(self._taking)
        while looked < CLAIM_DEPTH:
            page = await self.store.candidates(limit, after)
            for job in page:
                if self._held_here(job.prompt_id):
                    continue
                verdict = choose(job)
                left = left or verdict is Verdict.LEAVE
                if verdict is not Verdict.TAKE:
                    continue
                self._taking.add(job.prompt_id)
                try:
                    taken = await take(job)
                finally:
                    self._taking.discard(job.prompt_id)
                if taken is not None:
                    return taken, left
            looked += len(page)
            if len(page) < limit:
                break
            after = page[-1]
            limit = min(limit * 4, CLAIM_DEPTH - looked)
        return None, left

    def _held_here(self, prompt_id: str) -> bool:
        """Being taken by a slot here, or taken a moment ago (a read may predate it)."""
        return any(prompt_id in held for held in (self._taking, self._running, self._reserved))

    def _eligible(self, entry: _LaneSlots, job: Job) -> Verdict:
        """Whether this lane should take the job now."""
        if not self._may_take(entry, job):
            return Verdict.PASS
        avoid = self._avoid.get(job.prompt_id)
        # Affinity: leave the job to another lane that is free right now and warmer, but
        # not to one the job avoids (it would leave the job too, and no lane would take it).
        rivals = [
            other
            for other in self._lanes.values()
            if other is not entry
            and not (avoid and other.lane.name in avoid)
            and other.free_for(job)
        ]
        if not entry.would_queue:  # only lanes that would start it at once compete
            rivals = [other for other in rivals if not other.would_queue]
        elif any(not other.would_queue for other in rivals):
            return Verdict.LEAVE  # a lane that starts it at once takes it
        if not rivals:
            return Verdict.TAKE  # the common case (one lane, or the others busy): no scoring
        mine = entry.warmth.score(job.prompt)
        if any(other.warmth.score(job.prompt) > mine for other in rivals):
            return Verdict.LEAVE  # the others are woken once this claim returns
        return Verdict.TAKE

    async def _run(
        self,
        lane: Lane,
        job: Job,
        slot: _Slot | None = None,
        *,
        resume: bool = False,
        reserved: Job | None = None,
    ) -> asyncio.Task[None]:
        """Run one attempt until the lane's slot is free again: the attempt ended, or the
        lane released the slot early. What is left (reading the result, recording the end)
        goes on in the task returned (also the slot's `previous`), so the slot takes its
        next job meanwhile; that job's events wait for this one's done signal."""
        return await self._until_released(self._start(lane, job, slot, resume, reserved), slot)

    def _start(
        self,
        lane: Lane,
        job: Job,
        slot: _Slot | None,
        resume: bool = False,
        reserved: Job | None = None,
    ) -> _Started:
        """Count the job as running on the lane and start its attempt."""
        after = slot.previous if slot is not None else None
        entry = Running(job, lane, EventGate(after), reserved=reserved)
        self._running[job.prompt_id] = entry
        self.observers.job_started(job)
        slots = self._lanes.get(lane.name)
        if slots is not None:
            slots.busy += 1
            slots.warmth = Warmth.of(job.prompt)
            if slot is not None and not lane.in_process:
                entry.handle.on_accept(lambda: self._accepted(slots, slot, entry.handle))
        self._queue_changed()
        finishing = asyncio.create_task(self._finish(entry, resume), name=f"run-{job.prompt_id}")
        if slot is not None:
            slot.previous = finishing
        if entry.reserved is not None:
            entry.record_start(self.store)
            assert entry.starting is not None
            # Cancelled in the queue before its start was recorded: stop it there.
            entry.starting.add_done_callback(lambda done: _stop_if_refused(done, entry.handle))
        return _Started(entry, finishing)

    async def _until_released(self, started: _Started, slot: _Slot | None) -> asyncio.Task[None]:
        """Wait until the lane frees the slot; the rest of the attempt goes on in the
        task returned."""
        began = time.monotonic()
        try:
            await started.entry.handle.released.wait()  # set early by the lane, or by `_finish`
        except asyncio.CancelledError:
            await self._abandon(started, slot)
            raise
        self._slot_freed(started, slot)
        if slot is not None:
            slot.last_run = time.monotonic() - began
        finishing = started.finishing
        self._settling.add(finishing)
        finishing.add_done_callback(self._settling.discard)
        return finishing

    async def _abandon(self, started: _Started, slot: _Slot | None) -> None:
        """The slot was stopped mid-run: the job stays running in the store; the next
        start recovers it (re-queued, or asked after on its backend)."""
        entry = started.entry
        try:
            started.finishing.cancel()
            await asyncio.wait([started.finishing])
            if self._running.get(entry.job.prompt_id) is entry:
                del self._running[entry.job.prompt_id]
        finally:
            self._slot_freed(started, slot)

    def _slot_freed(self, started: _Started, slot: _Slot | None) -> None:
        slots = self._lanes.get(started.entry.lane.name)
        if slots is not None:
            slots.busy -= 1
            if slot is not None:
                slots.accepted.discard(slot)

    async def _finish(self, entry: Running, resume: bool) -> None:
        tag_job(entry.job)  # this task is the attempt: its log lines name the job
        try:
            result, failure = await self._attempt(entry.lane, entry.job, entry, resume)
        except BaseException:
            self._running.pop(entry.job.prompt_id, None)
            self._queue_changed()
            raise
        finally:
            entry.handle.release()  # the lane is done: its slot takes the next job meanwhile
        if await self._start_recorded(entry):
            await self._record(entry, result, failure)
        else:
            # Cancelled in the queue before its start was recorded: it ends there.
            self._running.pop(entry.job.prompt_id, None)
            self._queue_changed()
            await entry.gate.opened.wait()
            self.streams.forget(entry.job.prompt_id)
            self.observers.job_stopped(entry.job)

    async def _start_recorded(self, entry: Running) -> bool:
        """Whether a reserved job's start, recorded while it ran, holds: retried while
        the store refuses (nothing was written then), False if the job was cancelled."""
        if entry.starting is None:
            return True  # claimed, not reserved: recorded before it ran

        async def started() -> Job | None:
            assert entry.starting is not None
            try:
                return await entry.starting
            except StoreError:
                entry.record_start(self.store)  # the next try writes again
                raise

        if await self._retrying("the start", entry.job.prompt_id, started) is not None:
            return True
        self.pending += 1  # counted out when taken, and again by the cancel
        return False

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
        finished: JobResult | None = None
        try:
            finished = await self._settle_retrying(entry, result, failure)
        except Exception:
            # The job stays running in the store and is recovered at the next start.
            log.exception("could not record the end of %s", job.prompt_id)
        finally:
            self._running.pop(job.prompt_id, None)
            if finished is not None:
                ended = finished
                entry.gate.pass_on(lambda: self.streams.end(job, ended))
            self._queue_changed()  # as from ComfyUI: the end event, the count, the done signal
        await entry.gate.opened.wait()  # after the previous job's done signal
        if finished is not None:
            self.observers.job_finished(job, finished)
        else:
            self.observers.job_stopped(job)

    async def _settle_retrying(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> JobResult | None:
        """Record the end, retrying while the store refuses (a full disk, say)."""
        return await self._retrying(
            "the end", entry.job.prompt_id, lambda: self._settle(entry, result, failure)
        )

    async def _retrying(self, what: str, prompt_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """A job write, retried while the store refuses: the failed write was rolled back
        and job writes are fenced, so a retry is safe. Gives up only when the scheduler
        stops (the next start recovers the job)."""
        delay = 0.25
        while True:
            try:
                return await write()
            except StoreError as exc:
                if self._stopping:
                    raise
                log.warning("could not record %s of %s (%s); retrying", what, prompt_id, exc)
                await asyncio.sleep(delay)
                delay = min(RECORD_RETRY_MAX, delay * 2)

    def _sink_for(self, entry: Running) -> Any:
        job = entry.job

        def sink(event: EngineEvent) -> None:
            # The done signal waits until the end is recorded (`_record` sends it).
            if (
                isinstance(event, Message)
                and event.type == "executing"
                and event.data["node"] is None
            ):
                return
            entry.gate.pass_on(lambda: self.streams.event(job, event))

        return sink

    async def _settle(
        self, entry: Running, result: JobResult | None, failure: dict[str, Any] | None
    ) -> JobResult | None:
        """Record how the attempt ended; None when the job went back to the queue."""
        job = entry.job
        if entry.state is AttemptState.GIVING_BACK:
            await self._give_back(job, None)
            return None
        if entry.state is AttemptState.TAKING_BACK and entry.handle.withdrawn:
            # Taken out of its backend's queue for a free slot: not a failed attempt.
            await self._give_back(job, {"kind": "taken_back", "lane": entry.lane.name})
            return None
        if entry.state is AttemptState.CANCELLING:
            messages = result.messages if result else []
            error = result.error if result else None
            result = JobResult(JobStatus.CANCELLED, {}, {}, messages, error, [])
        else:
            decision = await self.retry.decide(job, entry.lane, result, failure)
            if decision.requeue:
                await self._give_back(job, decision.reason)
                return None
            result = decision.result
        assert result is not None
        self._avoid.pop(job.prompt_id, None)
        if await self.store.finish(job.prompt_id, job.attempt, result):
            return result
        return None

    async def _give_back(self, job: Job, reason: dict[str, Any] | None) -> None:
        if reason and reason.get("lane"):
            self._avoid[job.prompt_id] = self._avoid.get(job.prompt_id, frozenset()) | {
                reason["lane"]
            }
        if await self.store.requeue(job.prompt_id, job.attempt, reason):
            self.pending += 1
            self.observers.job_requeued(job, reason)
            self._wake()


def _unpark(entry: _LaneSlots, parked: _Parked) -> None:
    """A parked slot's wait timed out: it looks at the queue again, unless a submit took
    it meanwhile (its commit is under way, and the slot gets the job)."""
    if parked in entry.parked:
        entry.parked.remove(parked)
        parked.started.set_result(None)


def _runs_there(run: Running) -> bool:
    """A run its backend has started and not yet ended (not one waiting in its queue)."""
    handle = run.handle
    return handle.take_back is not None and not (handle.queued_there() or handle.released.is_set())


def _stop_if_refused(starting: asyncio.Future[Job | None], handle: LaneRun) -> None:
    if not starting.cancelled() and starting.exception() is None and starting.result() is None:
        handle.interrupt()
