"""What the parts of the scheduler share: its lanes and their slots, the attempts running
here, the jobs set aside for busy lanes, the pending count, the lanes re-queued jobs
avoid, and the wake-up of idle slots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from comfyfleet.domain.jobs import DispatchKey, JobStatus
from comfyfleet.lanes.base import Lane
from comfyfleet.scheduler.attempts import Running
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.slots import LaneSlots, Reservation
from comfyfleet.store.base import JobStore


class SchedulerState:
    def __init__(self, store: JobStore, observers: Observers, lanes: Sequence[Lane]) -> None:
        self.store = store
        self.observers = observers
        self.lanes = {lane.name: LaneSlots(lane) for lane in lanes}
        self.running: dict[str, Running] = {}
        # Jobs set aside for busy remote lanes (still pending in the store), by id.
        self.reserved: dict[str, Reservation] = {}
        # Pending jobs in the store, as counted here (recounted now and then).
        self.pending = 0
        self.running_elsewhere = 0  # by other gateways, at the last recount
        # Lanes a re-queued job should leave to others while another lane can run it.
        self.avoid: dict[str, frozenset[str]] = {}
        self.wakes = 0  # counts `wake` calls, so a slot notices one that came mid-claim
        self.stopping = False
        # Writes under way that must land before the store closes (ends being recorded,
        # reservations given back).
        self.settling: set[asyncio.Task[None]] = set()
        # Told when a job becomes claimable (see `work_arrived`).
        self.on_arrival: Callable[[DispatchKey | None], None] = lambda _key: None

    def settle(self, task: asyncio.Task[None]) -> None:
        """Keep `task` until it is done; `stop` waits for it."""
        self.settling.add(task)
        task.add_done_callback(self.settling.discard)

    @property
    def queue_remaining(self) -> int:
        """Pending and running jobs: every gateway's once `recount` has read them."""
        return max(0, self.pending) + len(self.running) + self.running_elsewhere

    async def recount(self) -> int:
        """Read the pending jobs, and those other gateways run, from the store (several
        gateways share it); returns `queue_remaining`. Announced by the caller."""
        counts = await self.store.counts()
        self.pending = counts.get(JobStatus.PENDING, 0)
        running = counts.get(JobStatus.RUNNING, 0)
        self.running_elsewhere = max(0, running - len(self.running))
        return self.queue_remaining

    def queue_changed(self) -> None:
        self.observers.queue_changed(self.queue_remaining)

    def wake(self) -> None:
        """Parked slots look at the queue again."""
        self.wakes += 1
        for entry in self.lanes.values():
            while entry.parked:
                parked = entry.parked.popleft()
                if not parked.started.done():
                    parked.started.set_result(None)

    def work_arrived(self, key: DispatchKey | None) -> None:
        """A job became claimable (queued, re-queued, given back): `key` is its place in
        the queue (None when not known here, e.g. another gateway's). Slots are woken."""
        self.on_arrival(key)
        self.wake()

    def avoid_lane(self, prompt_id: str, lane: str) -> None:
        self.avoid[prompt_id] = self.avoid.get(prompt_id, frozenset()) | {lane}
