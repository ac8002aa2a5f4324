"""The scheduler's records of lanes and their slots: what each lane runs now, which of
its slots wait for work, and the jobs set aside for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.domain.jobs import Job
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.lanes.base import Lane
from comfyfleet.scheduler.attempts import Running


@dataclass(eq=False)  # one per lane, kept in sets by identity
class LaneSlots:
    lane: Lane
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    idle: set[asyncio.Task[Any]] = field(default_factory=set)  # slots waiting, holding no job
    retiring: bool = False
    busy: int = 0  # jobs running there now
    warmth: Warmth = field(default_factory=Warmth)  # what it ran last
    # Slots with nothing to claim, each waiting for a wake-up or for a job `submit`
    # claimed for it and started there (the hand-off).
    parked: deque[Parked] = field(default_factory=deque)
    # Slots whose backend has queued their prompt: each may set its next job aside.
    accepted: set[Slot] = field(default_factory=set)

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
class Slot:
    previous: asyncio.Task[None] | None = None  # the slot's last job, finishing
    idled: bool = False  # its last wait for work timed out
    reserving: asyncio.Task[None] | None = None  # setting its next job aside
    last_run: float = 0.0  # how long its last job kept it busy (s)


@dataclass(eq=False)
class Parked:
    """A slot waiting for work: `started` gets None to look at the queue again, or the
    run of a job handed over (already started, so its submit is not held up by the
    slot's own wake-up)."""

    slot: Slot
    started: asyncio.Future[Started | None]
    task: asyncio.Task[Any]  # the slot's own


@dataclass(frozen=True)
class Started:
    entry: Running
    finishing: asyncio.Task[None]  # the attempt, then the recording of its end


@dataclass
class Reservation:
    job: Job  # pending in the store, set aside for `owner` (job.lane)
    owner: LaneSlots
    since: float  # time.monotonic() when it was made


def unpark(entry: LaneSlots, parked: Parked) -> None:
    """A parked slot's wait timed out: it looks at the queue again, unless a submit took
    it meanwhile (its commit is under way, and the slot gets the job)."""
    if parked in entry.parked:
        entry.parked.remove(parked)
        parked.started.set_result(None)
