"""Dispatch: each lane slot runs a loop that takes the next job for its lane when it is
free (one set aside for it, or one it claims from the store), so order lives in one
place (the store) and a job is never held by a slot that cannot run it. A slot with
nothing to take parks until woken, or until `submit` hands it a job."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from comfyfleet.domain.jobs import JobStatus
from comfyfleet.scheduler.attempts import AttemptState, Running
from comfyfleet.scheduler.candidates import Candidates
from comfyfleet.scheduler.choosing import eligible, may_take
from comfyfleet.scheduler.reservations import Reservations
from comfyfleet.scheduler.runner import Runner
from comfyfleet.scheduler.slots import LaneSlots, Parked, Reservation, Slot, Started, unpark
from comfyfleet.scheduler.state import SchedulerState

log = logging.getLogger(__name__)

#: How long a parked slot waits before it looks at the queue again anyway (s).
PARK_TIMEOUT = 1.0


class Dispatcher:
    def __init__(
        self,
        state: SchedulerState,
        runner: Runner,
        reservations: Reservations,
        candidates: Candidates,
    ) -> None:
        self._state = state
        self._runner = runner
        self._reservations = reservations
        self._candidates = candidates

    def start_slots(self, entry: LaneSlots) -> None:
        for slot in range(entry.lane.slots):
            name = f"{entry.lane.name}-slot-{slot}"
            entry.tasks.append(asyncio.create_task(self._slot_loop(entry), name=name))

    async def _slot_loop(self, entry: LaneSlots) -> None:
        slot = Slot()
        while not (self._state.stopping or entry.retiring):
            try:
                await self._take_one(entry, slot)
            except Exception:
                # A store failure must not cost the lane a slot; the job, if any, stays
                # running in the store and is recovered at the next start.
                log.exception("slot of lane %s failed; retrying", entry.lane.name)
                await asyncio.sleep(1.0)

    async def _take_one(self, entry: LaneSlots, slot: Slot) -> None:
        """Take and start the next job while the previous one's end is still being
        written; the new job's events wait for the previous done signal (EventGate)."""
        state, lane = self._state, entry.lane
        if not state.lease.held:
            async with entry.waiting():  # fenced out: no work until the lease holds again
                await state.lease.wait_held()
        if slot.reserving is not None and not slot.reserving.done():
            await asyncio.wait([slot.reserving])  # a reservation being made lands first
        await self._reservations.give_back(lambda r: not may_take(state, entry, r.job), of=entry)
        async with entry.waiting():  # holding no job: a retiring lane may cancel it here
            await lane.wait_ready()
        reserved = self._reservations.pick(entry, slot)
        if reserved is not None:
            await self._take_reserved(entry, slot, reserved)
            return
        wakes = state.wakes
        job = None
        # With nothing pending the claim would find nothing: park at once (a submit hands
        # its job over). After an idle second, claim anyway, should the count be off.
        if state.pending > 0 or slot.idled:
            job, left = await self._candidates.take_first(
                lambda job: eligible(state, entry, job),
                lambda job: state.store.claim_job(
                    job, lane.name, state.shares.policy.of(job.tenant).max_running
                ),
                lane.only_tenant,
            )
            if left:
                state.wake()  # a warmer (or sooner) free lane should take what this one left
                # ... and gets the loop to do so: a claim from a kept page never yields,
                # and slots leaving jobs to each other must not starve everything else.
                await asyncio.sleep(0)
        slot.idled = False
        if job is not None:
            # Not clamped: a claim can land before its submit's increment; they net out.
            state.pending -= 1
            await self._runner.run(lane, job, slot)
        elif wakes == state.wakes:  # nothing new since the queue was looked at: wait
            if await self._take_back_for(entry):
                return  # it is about to be queued again: claim it
            handed = await self._park(entry, slot)
            if handed is None:
                slot.idled = wakes == state.wakes  # timed out, not woken
            else:
                await self._runner.until_released(handed, slot)

    async def _take_reserved(self, entry: LaneSlots, slot: Slot, taken: Reservation) -> None:
        state, lane = self._state, entry.lane
        if taken.owner is entry:
            # Set aside for this lane already: the backend gets it, then its start is
            # recorded (a restart asks that backend about any reservation it finds).
            state.pending -= 1
            job = replace(
                taken.job,
                status=JobStatus.RUNNING,
                attempt=taken.job.attempt + 1,
                lane=lane.name,
                started_at=time.time(),
            )
            await self._runner.run(lane, job, slot, reserved=taken.job)
            return
        # Another lane's: recorded as running here first, so a restart asks this backend.
        try:
            started = await state.store.start_reserved(taken.job, lane.name)
        except BaseException:
            self._reservations.put_back(taken)  # still set aside in the store
            raise
        if started is not None:
            state.pending -= 1
            self._reservations.reserve_ahead()  # its lane may set another aside
            await self._runner.run(lane, started, slot)

    async def _take_back_for(self, entry: LaneSlots) -> bool:
        """A free slot with nothing to claim takes back a prompt that waits in another
        backend's queue behind a running one (prefetch), the earliest in queue order, if
        it can start it at once (its own backend is idle). True when one was taken
        back: it is about to be queued again."""
        if entry.would_queue:
            return False  # it would only wait in this backend's queue instead
        if not self._state.stacked:
            return False  # no backend runs two: none has one waiting behind another
        runs = self._state.running.values()
        started = {r.lane for r in runs if _runs_there(r)}
        waiting = [
            r
            for r in runs
            if r.lane in started
            and r.lane is not entry.lane
            and r.handle.take_back is not None
            and r.handle.queued_there()
            and r.state is AttemptState.RUNNING
            and may_take(self._state, entry, r.job)
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

    async def _park(self, entry: LaneSlots, slot: Slot) -> Started | None:
        """Wait (a second at most) for a wake-up, or for a job `submit` hands over."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        parked = Parked(slot, loop.create_future(), task)
        entry.parked.append(parked)
        # Awaited directly (no wait_for): a hand-off reaches the slot in one loop pass.
        timer = loop.call_later(PARK_TIMEOUT, unpark, entry, parked)
        try:
            async with entry.waiting():
                return await parked.started  # a cancel here cancels it: see Admission
        except asyncio.CancelledError:
            if parked in entry.parked:
                entry.parked.remove(parked)
            handed = parked.started
            if handed.done() and not handed.cancelled() and (run := handed.result()) is not None:
                await self._runner.abandon(run, slot)  # handed over a moment ago
            raise
        finally:
            timer.cancel()


def _runs_there(run: Running) -> bool:
    """A run its backend has started and not yet ended (not one waiting in its queue)."""
    handle = run.handle
    return handle.take_back is not None and not (handle.queued_there() or handle.released.is_set())
