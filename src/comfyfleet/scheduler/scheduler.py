"""The scheduler: admits jobs, feeds lane slots from the store, cancels exactly what is
named. `Scheduler` is the face the server, lanes and fleet manager use; the work is
done by its parts, each in a module of its own:

- admission.py: submit (QueueFull, the hand-off to a parked slot), cancels;
- dispatch.py: the slot loops, taking the next job (candidates.py reads and claims it,
  choosing.py says which lane should take which job), taking back a prefetched prompt;
- reservations.py: jobs set aside for busy remote lanes;
- runner.py and recording.py: one attempt, from its start to its recorded end;
- recovery.py: start-up recovery, adoption, the lease and take-over of dead gateways' jobs;
- lease.py: what this gateway can prove of its lease (fenced: no work);
- fencing.py: what runs in this process while fenced (held back; dropped if taken over).

What they share (lanes, running attempts, the pending count) is in state.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence

from comfyfleet.domain.gateways import DEFAULT_LEASE
from comfyfleet.domain.jobs import Job, NewJob
from comfyfleet.lanes.base import Lane
from comfyfleet.scheduler.admission import Admission, QueueFull, TenantQueueFull
from comfyfleet.scheduler.attempts import AttemptState, Running
from comfyfleet.scheduler.candidates import Candidates
from comfyfleet.scheduler.dispatch import Dispatcher
from comfyfleet.scheduler.fair_share import FairShare
from comfyfleet.scheduler.fencing import InProcessFence
from comfyfleet.scheduler.holds import HOLD_CHECK
from comfyfleet.scheduler.lease import LeaseGuard
from comfyfleet.scheduler.observers import JobObserver, Observers
from comfyfleet.scheduler.recording import Recorder
from comfyfleet.scheduler.recovery import Recovery
from comfyfleet.scheduler.reservations import Reservations
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.scheduler.runner import Runner
from comfyfleet.scheduler.slots import LaneSlots
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.scheduler.streams import PromptStreams
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.store.base import JobStore

log = logging.getLogger(__name__)

__all__ = ["QueueFull", "Scheduler", "TenantQueueFull"]


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        lanes: Sequence[Lane],
        *observers: JobObserver,
        max_pending: int = 10_000,
        max_attempts: int = 3,
        lease: float = DEFAULT_LEASE,
        shares: SharePolicy | None = None,
        tenants: bool = False,
    ) -> None:
        """`shares`: the tenants' weights, caps and classes; `tenants`: whether jobs
        may belong to more than one tenant (authentication is on). With neither, one
        queue order serves all and fair share costs nothing."""
        self.store = store
        self.observers = Observers(*observers)  # told what happens to each job
        self.streams = PromptStreams(self.observers)
        self.retry = RetryPolicy(store, max_attempts)
        guard = LeaseGuard(lease, enforced=store.shared)
        self.state = SchedulerState(store, self.observers, lanes, guard)
        policy = shares or SharePolicy()
        on = policy.enabled and (tenants or bool(policy.tenants))
        self.state.shares = FairShare(policy, store, enabled=on)
        candidates = Candidates(self.state)
        self._reservations = Reservations(self.state, candidates)
        self._recorder = Recorder(self.state, self.streams, self.retry)
        self._runner = Runner(self.state, self.streams, self._recorder, self._reservations.accepted)
        self._dispatch = Dispatcher(self.state, self._runner, self._reservations, candidates)
        self._admission = Admission(
            self.state, self.streams, self._runner, self._recorder, self._reservations, max_pending
        )
        self._recovery = Recovery(self.state, self._runner, self._reservations, lease)
        self._holds_watch: asyncio.Task[None] | None = None
        self._fence = InProcessFence(self.state)

    def include(self, lane: Lane) -> None:
        """Add a lane before `start` (at run time, use `add_lane`)."""
        if lane.name in self.state.lanes:
            raise ValueError(f"lane {lane.name} already exists")
        self.state.add_lane(LaneSlots(lane))

    @property
    def lanes(self) -> list[Lane]:
        return [entry.lane for entry in self.state.lanes.values()]

    @property
    def pending(self) -> int:
        """Pending jobs as counted here (recounted from the store now and then)."""
        return self.state.pending

    @property
    def shares(self) -> FairShare:
        """The tenants' shares of the slots (see scheduler/fair_share.py)."""
        return self.state.shares

    @property
    def max_pending(self) -> int:
        return self._admission.max_pending

    @property
    def lease(self) -> float:
        """This gateway's lease on its jobs, in seconds."""
        return self._recovery.lease

    @property
    def lease_guard(self) -> LeaseGuard:
        """What this gateway can prove of its lease now (see scheduler/lease.py)."""
        return self.state.lease

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        await self._recovery.recover()
        for entry in self.state.lanes.values():
            await self._start_lane(entry)
        await self.store.watch_work(self._recovery.work_elsewhere)
        # Fenced, what runs in this process pauses; a backend's prompts run on there and
        # are followed by whoever holds them next.
        self.state.lease.on_lost = self._fence.fenced
        self.state.lease.on_held = self._lease_held
        self.state.lease.start()
        self._recovery.keep_lease()
        self._holds_watch = asyncio.create_task(self._watch_holds(), name="holds")

    def _lease_held(self) -> None:
        self._fence.held()
        self.state.wake()

    def keep_holds(self, prompt_ids: Sequence[str], seconds: float) -> list[str]:
        """A gateway still wants these of the prompts it sent here: they may run `seconds`
        more (see scheduler/holds.py). Returns those held here."""
        kept = self.state.holds.keep(prompt_ids, seconds)
        if kept:
            self.state.wake()
        return kept

    def release_holds(self, prompt_ids: Sequence[str]) -> list[str]:
        """Let go of these held prompts now: running ones are given back to the queue at
        once (as a lapsed hold's are). Returns those held here."""
        released = self.state.holds.release(prompt_ids)
        self._give_back_lapsed()
        return released

    def _give_back_lapsed(self) -> None:
        for entry in self.state.holds.lapsed(self.state.running.values()):
            log.warning("gave back %s: its gateway no longer keeps it", entry.job.prompt_id)

    def awake_for(self) -> float:
        """How long this process has run without a stop (see scheduler/holds.py)."""
        return self.state.holds.awake_for()

    async def _watch_holds(self) -> None:
        """Give back held prompts whose gateway stopped wanting them; drop those none
        wanted for long."""
        state = self.state
        while True:
            await asyncio.sleep(HOLD_CHECK)
            state.holds.checked()
            self._give_back_lapsed()
            unclaimed = state.holds.unclaimed(state.running)
            if unclaimed:
                dropped = await self._admission.delete_pending(unclaimed)
                if dropped:
                    log.warning("dropped %d held prompts no gateway kept", len(dropped))

    async def _start_lane(self, entry: LaneSlots) -> None:
        await entry.lane.start(functools.partial(self._recovery.adopt, entry.lane))
        self._dispatch.start_slots(entry)

    async def add_lane(self, lane: Lane) -> None:
        if lane.name in self.state.lanes:
            raise ValueError(f"lane {lane.name} already exists")
        entry = LaneSlots(lane)
        self.state.add_lane(entry)
        await self._recovery.recover_lane(lane)  # before it connects and sorts out its queue
        await self._start_lane(entry)
        self.state.wake()

    async def remove_lane(self, name: str, timeout: float | None = None) -> None:
        """Stop giving the lane work, let its running jobs end (or re-queue them after
        `timeout`), then close it."""
        entry = self.state.lanes[name]
        self.state.retire(entry)
        await self._wind_down(entry.tasks, timeout, lambda r: r.lane is entry.lane)
        await self._reservations.give_back(lambda _r: True, of=entry, settle=True)
        self.state.remove_lane(entry)
        await entry.lane.close()

    async def stop(self, grace: float, before_requeue: Callable[[], None] | None = None) -> None:
        """Stop claiming; let running jobs finish for `grace` seconds, then re-queue them
        (`before_requeue` is called first: what they started must outlive the process)."""
        self.state.stopping = True
        await self._recovery.stop_keeping()
        self.state.lease.stop()
        await self._fence.close()
        if self._holds_watch is not None:
            self._holds_watch.cancel()
            await asyncio.gather(self._holds_watch, return_exceptions=True)
        lanes = self.state.lanes.values()
        tasks = [t for entry in lanes for t in entry.tasks] + list(self._runner.resumes)
        await self._wind_down(tasks, grace, lambda _r: True, before_requeue)
        await self._reservations.give_back(lambda _r: True, settle=True)
        for entry in self.state.lanes.values():
            await entry.lane.close()

    async def take_over_orphans(self) -> None:
        """Take over the jobs of gateways whose lease ran out now, as the lease keeper's
        tick does: re-queued, adopted and followed, or their reservations given back."""
        await self._recovery.take_over_orphans()

    async def _wind_down(
        self,
        tasks: list[asyncio.Task[None]],
        timeout: float | None,
        which: Callable[[Running], bool],
        before_requeue: Callable[[], None] | None = None,
    ) -> None:
        state = self.state
        state.wake()
        winding = set(tasks)
        for slots in state.lanes.values():
            for idle in slots.idle & winding:
                idle.cancel()  # waiting for work or for its lane: nothing to finish
        live = [t for t in tasks if not t.done()]
        _, late = await asyncio.wait(live, timeout=timeout) if live else (set(), set())
        if late:
            if before_requeue is not None:
                before_requeue()
            for entry in state.running.values():
                if which(entry) and entry.to(AttemptState.GIVING_BACK):
                    entry.handle.interrupt()
            await asyncio.wait(late, timeout=max(timeout or 0.0, 5.0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Ends already reached are still written down before the store closes.
        if state.settling:
            await asyncio.wait(list(state.settling), timeout=30.0)

    # -- what runs where -------------------------------------------------------

    def running_jobs(self) -> list[Job]:
        """The jobs running now (or handed to their lane a moment ago), each with its lane."""
        return [run.job for run in self.state.running.values()]

    def running_job(self, prompt_id: str) -> Job | None:
        run = self.state.running.get(prompt_id)
        return run.job if run is not None else None

    def cancelling(self, prompt_id: str) -> bool:
        """Whether a job running here was cancelled and has not stopped yet."""
        run = self.state.running.get(prompt_id)
        return run is not None and run.state is AttemptState.CANCELLING

    def runs_on(self, lane: str) -> list[str]:
        """Prompt ids running on a lane (its backend has them, or is about to)."""
        return sorted(p for p, run in self.state.running.items() if run.lane.name == lane)

    def reserved_for(self, lane: str) -> list[str]:
        """Prompt ids set aside for a lane, in queue order."""
        return self._reservations.reserved_for(lane)

    @property
    def queue_remaining(self) -> int:
        """Pending and running jobs: every gateway's once `recount` has read them."""
        return self.state.queue_remaining

    async def recount(self) -> int:
        """Read the pending jobs, and those other gateways run, from the store (several
        gateways share it); returns `queue_remaining`. Announced by the caller."""
        return await self.state.recount()

    @property
    def waiting_slots(self) -> int:
        """Slots waiting for work right now: a new prompt goes straight to one of them."""
        return sum(len(entry.parked) for entry in self.state.lanes.values())

    # -- admission and cancellation ------------------------------------------------

    async def submit(self, new: NewJob) -> Job:
        """Queue a job (or hand it to a parked slot); QueueFull beyond `max_pending`,
        TenantQueueFull beyond its tenant's `max_queued` (a QueueFull too)."""
        self.state.holds.submitted(new.prompt_id, new.extra_data)  # before it may start
        return await self._admission.submit(new)

    def interrupt(self, prompt_id: str | None = None) -> list[str]:
        """Interrupt one running job, or every running job when no id is given."""
        return self._admission.interrupt(prompt_id)

    async def delete_pending(self, prompt_ids: Sequence[str]) -> list[str]:
        """Cancel these jobs where they are still pending; the ids cancelled."""
        return await self._admission.delete_pending(prompt_ids)

    async def clear_pending(self) -> list[str]:
        """Cancel every pending job; their ids."""
        return await self._admission.clear_pending()

    async def cancel(self, prompt_ids: Sequence[str]) -> list[str]:
        """Cancel pending or running jobs; a running one is interrupted and ends cancelled."""
        return await self._admission.cancel(prompt_ids)

    def wake(self) -> None:
        """Idle slots look at the queue again (a lane became able to run more)."""
        self.state.wake()
