"""Reservations: a slot of a remote lane, once its backend has queued its prompt, sets
its next job aside in the store (still pending, reserved for that lane), so that job is
submitted the moment the backend reports the prompt's end.

Reservations never hold a job back: a slot that frees up with none of its own takes
another lane's, one that has waited long goes to any free slot, and a job submitted
ahead of a reserved one in queue order sends the reservation back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence

from comfyfleet.domain.jobs import Job
from comfyfleet.lanes.base import LaneRun
from comfyfleet.scheduler.candidates import Candidates
from comfyfleet.scheduler.choosing import may_take, reservable
from comfyfleet.scheduler.slots import LaneSlots, Reservation, Slot
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.store.base import StoreError

log = logging.getLogger(__name__)

#: A reservation that has waited this many times as long as a slot's last run goes to
#: that slot even if it has one of its own: no job waits long behind a long prompt.
RESERVATION_PATIENCE = 1.5
#: Reservations being made at once (each is a look through the queue and a write).
RESERVING = 8


class Reservations:
    def __init__(self, state: SchedulerState, candidates: Candidates) -> None:
        self._state = state
        self._candidates = candidates
        self._reserving: set[asyncio.Task[None]] = set()  # reservations being made

    def reserved_for(self, lane: str) -> list[str]:
        """Prompt ids set aside for a lane, in queue order."""
        entry = self._state.lanes.get(lane)
        return (
            [] if entry is None else [r.job.prompt_id for r in self._state.reserved.of_lane(entry)]
        )

    def pick(self, entry: LaneSlots, slot: Slot) -> Reservation | None:
        """The reservation a free slot starts next, taken out of the pool: its lane's
        earliest, unless another lane's (which this one can run) is due first, because
        this lane has none or because it has waited long."""
        state = self._state
        # In queue order, so whether this lane can run one (node code's classes, model
        # files) is asked of the first few only, not of a thousand lanes' reservations.
        own = state.reserved.of_lane(entry)
        mine = next((r for r in own if may_take(state, entry, r.job)), None)
        others = next(
            (
                r
                for r in itertools.takewhile(lambda r: r is not mine, state.reserved.in_order())
                if r.owner is not entry and may_take(state, entry, r.job)
            ),
            None,
        )
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
            state.reserved.pop(chosen.job.prompt_id)
        return chosen

    def put_back(self, reservation: Reservation) -> None:
        """A reservation picked but not started: it is still set aside in the store."""
        self._state.reserved.add(reservation)

    def accepted(self, entry: LaneSlots, slot: Slot, handle: LaneRun) -> None:
        """A backend queued the slot's prompt: the slot may set its next job aside."""
        if not handle.released.is_set():
            self._state.accept(entry, slot)
            # Every lane's, not only this one's: a lane whose last try found every
            # candidate being taken by others tries again now.
            self.reserve_ahead()

    def reserve_ahead(self) -> None:
        """A backend queued a slot's prompt, work arrived, or a reservation went
        elsewhere: busy slots whose backend has their prompt set their next job aside.
        No more start than there are pending jobs not set aside nor about to be claimed
        by a free lane (which a reservation leaves to it), and at most RESERVING at once:
        a job that arrives starts one reservation at most, not one for each of a thousand
        busy lanes (all but one of which would find nothing), and while lanes come free
        and busy again by the hundred, few look for what those claim."""
        state = self._state
        unclaimed = state.pending - len(state.reserved) - len(state.free)
        budget = min(unclaimed, RESERVING) - len(self._reserving)
        for entry in state.accepting:  # the lanes whose backends hold a prompt
            if budget <= 0:
                return
            budget -= self._reserve_for(entry, budget)

    def _reserve_for(self, entry: LaneSlots, most: int) -> int:
        """Let the lane's accepted slots set their next job aside, `most` of them at
        most; how many started to."""
        held = self._state.reserved.held_by(entry)
        started = 0
        if held < entry.lane.slots:  # a lane holding all it may is passed at once
            for slot in entry.accepted:
                if started >= most:
                    break
                started += self._reserve_soon(entry, slot, held)
        return started

    def make_way_for(self, job: Job) -> None:
        """A new job ahead of reserved ones in queue order: those whose lane could run it
        go back to the queue, so it starts first."""
        behind = [
            r for r in self._state.reserved.behind(job.dispatch_key()) if r.owner.lane.can_run(job)
        ]
        if behind:
            self._state.settle(asyncio.create_task(self._unreserve(self._set_free(behind))))

    async def give_back(
        self,
        which: Callable[[Reservation], bool],
        *,
        of: LaneSlots | None = None,
        settle: bool = False,
    ) -> None:
        """Reservations `which` accepts (of the lane `of`, or of every lane) go back to
        the queue; with `settle`, reservations being made are waited for first (and
        count too)."""
        if settle and self._reserving:
            await asyncio.wait(list(self._reserving))
        reserved = self._state.reserved
        held = reserved.of_lane(of) if of is not None else list(reserved.in_order())
        await self._unreserve(self._set_free([r for r in held if which(r)]))

    async def unreserve(self, prompt_ids: list[str]) -> None:
        """Give jobs set aside by a gateway that is gone back to the queue."""
        await self._unreserve(prompt_ids)

    def drop(self, prompt_ids: Sequence[str]) -> None:
        """Forget the reservations of jobs being cancelled."""
        for prompt_id in prompt_ids:
            self._state.reserved.pop(prompt_id)

    def drop_all(self) -> None:
        self._state.reserved.clear()

    def _reserve_soon(self, entry: LaneSlots, slot: Slot, held: int) -> bool:
        """Set the slot's next job aside (it holds `held` already), if there is one no
        free slot is about to take; whether it started to."""
        state = self._state
        if state.stopping or entry.retiring or not state.lease.held:
            return False
        if slot.reserving is not None and not slot.reserving.done():
            return False
        if state.pending - len(state.reserved) <= 0 or entry.busy < entry.lane.slots:
            return False
        if held >= entry.lane.slots:
            return False
        task = asyncio.create_task(self._reserve(entry), name=f"reserve-{entry.lane.name}")
        slot.reserving = task
        self._reserving.add(task)
        task.add_done_callback(self._reserving.discard)
        return True

    async def _reserve(self, entry: LaneSlots) -> None:
        lane = entry.lane.name
        try:
            job, _ = await self._candidates.take_first(
                lambda j: reservable(self._state, entry, j),
                lambda j: self._state.store.reserve_job(j, lane),
                entry.lane.only_tenant,
            )
        except StoreError as exc:
            log.info("could not reserve a job for %s: %s", lane, exc)
            return
        if job is not None:
            self._state.reserved.add(Reservation(job, entry, time.monotonic()))
            # Done: the next reservation that RESERVING kept waiting starts now (one that
            # found nothing starts none, so a look that finds nothing is not repeated).
            self._reserving.difference_update({asyncio.current_task()})
            self.reserve_ahead()

    def _set_free(self, reservations: list[Reservation]) -> list[str]:
        """Out of the pool at once (no slot takes them now); `_unreserve` tells the store."""
        reserved = self._state.reserved
        return [r.job.prompt_id for r in reservations if reserved.pop(r.job.prompt_id)]

    async def _unreserve(self, ids: list[str]) -> None:
        if ids:
            await self._state.store.unreserve(ids)
            self._state.work_arrived(None)
