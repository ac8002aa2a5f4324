"""What the parts of the scheduler share: its lanes and their slots, the attempts running
here, the jobs set aside for busy lanes, the pending count, the lanes re-queued jobs
avoid, and the wake-up of idle slots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from comfyfleet.domain.gateways import DEFAULT_LEASE
from comfyfleet.domain.jobs import DispatchKey, Job, JobStatus
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.lanes.base import Lane
from comfyfleet.scheduler.attempts import Running
from comfyfleet.scheduler.fair_share import FairShare
from comfyfleet.scheduler.holds import Holds
from comfyfleet.scheduler.lease import LeaseGuard
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.reserved import ReservedJobs
from comfyfleet.scheduler.slots import LaneSlots, Slot
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.store.base import JobStore

#: Jobs whose wanted Warmth is kept (about one per pending job a fleet looks at).
WARMTH_KEPT = 4096


class SchedulerState:
    def __init__(
        self,
        store: JobStore,
        observers: Observers,
        lanes: Sequence[Lane],
        lease: LeaseGuard | None = None,
    ) -> None:
        self.store = store
        # What this gateway can prove of its lease (by default: no one else to prove it to).
        self.lease = lease or LeaseGuard(DEFAULT_LEASE, enforced=False)
        self.observers = observers
        self.lanes = {lane.name: LaneSlots(lane) for lane in lanes}
        # The lanes with a slot free (by name): what looks for a free lane looks here,
        # not at every lane of a fleet of thousands. Kept by `taken` and `released`.
        self.free: dict[str, LaneSlots] = dict(self.lanes)
        self.running: dict[str, Running] = {}
        # Jobs set aside for busy remote lanes (still pending in the store).
        self.reserved = ReservedJobs()
        # The lanes with a slot whose backend holds its prompt (see `accept`).
        self.accepting: set[LaneSlots] = set()
        # The lanes running more than one job: only there can one wait in the backend's
        # queue behind another (see Dispatcher._take_back_for).
        self.stacked: set[LaneSlots] = set()
        # Pending jobs in the store, as counted here (recounted now and then).
        self.pending = 0
        self.running_elsewhere = 0  # by other gateways, at the last recount
        # Lanes a re-queued job should leave to others while another lane can run it.
        self.avoid: dict[str, frozenset[str]] = {}
        self.wakes = 0  # counts `wake` calls, so a slot notices one that came mid-claim
        self._woken = 0  # where the next wake for one job starts among the lanes
        self.stopping = False
        # Prompts a gateway sent here (HOLD_KEY): run only while it keeps wanting them.
        self.holds = Holds()
        # The tenants' shares of the slots (off until the scheduler sets a policy).
        self.shares = FairShare(SharePolicy(), store, enabled=False)
        # Writes under way that must land before the store closes (ends being recorded,
        # reservations given back).
        self.settling: set[asyncio.Task[None]] = set()
        self._warmth: dict[str, Warmth] = {}  # by prompt id, see `warmth_of`
        # The lanes warm for each model file and root node (see `Warmth.marks`): the only
        # lanes that can be warmer for a job than a cold one.
        self._warm_lanes: dict[str, set[LaneSlots]] = {}
        # Told when a job becomes claimable (see `work_arrived`).
        self.on_arrival: Callable[[DispatchKey | None], None] = lambda _key: None

    def warmth_of(self, job: Job) -> Warmth:
        """What the job wants of a lane (model files, root nodes), worked out once per
        job: every free slot that looks at the job asks."""
        wanted = self._warmth.get(job.prompt_id)
        if wanted is None:
            wanted = self._warmth[job.prompt_id] = Warmth.of(job.prompt)
            if len(self._warmth) > WARMTH_KEPT:
                del self._warmth[next(iter(self._warmth))]  # the oldest asked
        return wanted

    def warmed(self, entry: LaneSlots, warmth: Warmth) -> None:
        """The lane ran a job that wanted `warmth` last: it is warm for that now."""
        for key in entry.warmth.marks():
            lanes = self._warm_lanes.get(key)
            if lanes is not None:
                lanes.discard(entry)
                if not lanes:
                    del self._warm_lanes[key]
        entry.warmth = warmth
        for key in entry.warmth.marks():
            self._warm_lanes.setdefault(key, set()).add(entry)

    def warm_and_free(self, wanted: Warmth) -> bool:
        """Whether a free lane shares a model file or root node with `wanted`."""
        return any(
            entry.lane.name in self.free
            for key in wanted.marks()
            for entry in self._warm_lanes.get(key, ())
        )

    def warm_for(self, wanted: Warmth) -> set[LaneSlots]:
        """The lanes that share a model file or root node with `wanted`."""
        found: set[LaneSlots] = set()
        for key in wanted.marks():
            found |= self._warm_lanes.get(key, set())
        return found

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

    def wake(self, job: Job | None = None) -> None:
        """Parked slots look at the queue again: every one, or for one new `job` one slot
        of a lane that can run it (a thousand idle backends would otherwise all read the
        queue for each job; the one woken wakes the rest if it leaves the job to them)."""
        self.wakes += 1
        if job is not None:  # from the lane after the last one woken: each gets its turn
            lanes = list(self.free.values())  # a parked slot holds no job: its lane is free
            start = self._woken % len(lanes) if lanes else 0
            turns = lanes[start:] + lanes[:start]
            for at_once in (True, False):  # a lane that starts it at once first
                for turn, entry in enumerate(turns):
                    if (
                        entry.parked
                        and not entry.retiring
                        and entry.would_queue is not at_once
                        and entry.lane.can_run(job)
                        and _wake_one(entry)
                    ):
                        self._woken = start + turn + 1
                        return
        for entry in self.lanes.values():
            while _wake_one(entry):
                pass

    def accept(self, entry: LaneSlots, slot: Slot) -> None:
        """The lane's backend holds the slot's prompt: it may set its next job aside."""
        entry.accepted.add(slot)
        self.accepting.add(entry)

    def unaccept(self, entry: LaneSlots, slot: Slot) -> None:
        entry.accepted.discard(slot)
        if not entry.accepted:
            self.accepting.discard(entry)

    def add_lane(self, entry: LaneSlots) -> None:
        self.lanes[entry.lane.name] = self.free[entry.lane.name] = entry

    def remove_lane(self, entry: LaneSlots) -> None:
        """Forget a lane that has wound down."""
        name = entry.lane.name
        if self.lanes.get(name) is entry:
            del self.lanes[name]
        if self.free.get(name) is entry:
            del self.free[name]
        self.accepting.discard(entry)
        self.stacked.discard(entry)
        self.warmed(entry, Warmth())  # out of the warm-lane index

    def retire(self, entry: LaneSlots) -> None:
        entry.retiring = True
        self.free.pop(entry.lane.name, None)

    def taken(self, entry: LaneSlots) -> None:
        """One more job runs on the lane."""
        entry.busy += 1
        if entry.busy >= entry.lane.slots:
            self.free.pop(entry.lane.name, None)
        if entry.busy > 1:
            self.stacked.add(entry)

    def released(self, entry: LaneSlots) -> None:
        """One job fewer runs on the lane."""
        entry.busy -= 1
        if entry.busy <= 1:
            self.stacked.discard(entry)
        name = entry.lane.name
        if entry.busy < entry.lane.slots and not entry.retiring and self.lanes.get(name) is entry:
            self.free[name] = entry

    def work_arrived(self, key: DispatchKey | None, job: Job | None = None) -> None:
        """A job became claimable (queued, re-queued, given back): `key` is its place in
        the queue (None when not known here, e.g. another gateway's). Slots are woken:
        one that can run it, when the job is known here."""
        self.on_arrival(key)
        self.wake(job)

    def avoid_lane(self, prompt_id: str, lane: str) -> None:
        self.avoid[prompt_id] = self.avoid.get(prompt_id, frozenset()) | {lane}


def _wake_one(entry: LaneSlots) -> bool:
    """Wake one of the lane's parked slots; False when none was waiting."""
    while entry.parked:
        parked = entry.parked.popleft()
        if not parked.started.done():
            parked.started.set_result(None)
            return True
    return False
