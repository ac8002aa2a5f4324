"""Admission: what enters the queue and what leaves it before running. `submit` refuses
work beyond the pending limit (QueueFull; counted by the store when other gateways
share it, so the limit holds for all of them together) and beyond the tenant's cap
(TenantQueueFull; always counted by the store, in the insert), hands a job straight to
a parked slot when nothing else waits (one commit: queued as claimed), and otherwise
queues it and wakes the slots; cancels take pending jobs out and interrupt running ones."""

from __future__ import annotations

from collections.abc import Sequence

from comfyfleet.domain.jobs import Job, NewJob
from comfyfleet.errors import ComfyfleetError
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.scheduler.attempts import AttemptState
from comfyfleet.scheduler.recording import Recorder
from comfyfleet.scheduler.reservations import Reservations
from comfyfleet.scheduler.runner import Runner
from comfyfleet.scheduler.slots import LaneSlots, Parked
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.scheduler.streams import PromptStreams
from comfyfleet.store.base import PendingLimitReached, QueuedLimitReached

#: Seconds a tenant at its cap is told to wait (Retry-After): a place frees only when one
#: of its own prompts starts or is cancelled, which is seldom sooner than a few seconds.
TENANT_RETRY_AFTER = 5.0


class QueueFull(ComfyfleetError):
    """Admission refused: too many pending jobs."""

    #: What the refused client reads (the `message` of ComfyUI's error object).
    message = "Too many prompts are pending"

    def __init__(self, pending: int, retry_after: float, details: str = "") -> None:
        super().__init__(details or f"{pending} prompts are pending; try again later")
        self.pending = pending
        self.retry_after = retry_after


class TenantQueueFull(QueueFull):
    """Admission refused: the submitting tenant has its cap (`max_queued`) of prompts
    pending. Says only the cap: other tenants' queues are not the caller's to know."""

    message = "Too many of this tenant's prompts are pending"

    def __init__(self, cap: int, retry_after: float) -> None:
        details = (
            f"this tenant may have at most {cap} prompts waiting to run (max_queued); "
            "try again once some have started"
        )
        super().__init__(cap, retry_after, details)
        self.cap = cap


class Admission:
    def __init__(
        self,
        state: SchedulerState,
        streams: PromptStreams,
        runner: Runner,
        recorder: Recorder,
        reservations: Reservations,
        max_pending: int,
    ) -> None:
        self._state = state
        self._streams = streams
        self._runner = runner
        self._recorder = recorder
        self._reservations = reservations
        self.max_pending = max_pending
        self._submitting = 0  # submissions not yet counted in `pending`

    async def submit(self, new: NewJob) -> Job:
        state = self._state
        if state.stopping:
            raise QueueFull(state.pending, retry_after=5.0)
        # The count here is the whole queue's when no other gateway shares the store;
        # otherwise it misses their submits since the last recount, and the store counts.
        shared = state.store.shared
        if not shared and state.pending >= self.max_pending:
            raise QueueFull(state.pending, retry_after=1.0)
        slot = self._idle_slot_for(new)
        if slot is not None:
            # Running at once, not queued: the tenant's cap on waiting prompts is not asked.
            return await self._hand_off(new, *slot)
        limit = self.max_pending if shared else None
        cap = state.shares.policy.of(new.tenant).max_queued
        self._submitting += 1
        try:
            job = await state.store.submit(new, max_pending=limit, max_queued=cap)
        except QueuedLimitReached as full:
            raise TenantQueueFull(full.limit, retry_after=TENANT_RETRY_AFTER) from None
        except PendingLimitReached as full:
            raise QueueFull(full.limit, retry_after=1.0) from None
        finally:
            self._submitting -= 1
        state.pending += 1
        state.observers.job_submitted(job)
        state.queue_changed()
        state.shares.arrived(job.tenant)
        state.work_arrived(job.dispatch_key(), job)
        self._reservations.make_way_for(job)
        self._reservations.reserve_ahead()
        return job

    def _idle_slot_for(self, new: NewJob) -> tuple[LaneSlots, Parked] | None:
        """A parked slot to give a new job straight to, when nothing else is queued or
        being queued: the job would be the next one claimed anyway. The warmest wins."""
        state = self._state
        if state.pending > 0 or self._submitting or not state.lease.held:
            return None
        if state.shares.policy.of(new.tenant).max_running is not None:
            return None  # capped: only a claim counts its running jobs fleet-wide
        job = new.pending(0, 0.0)
        wanted = Warmth.of(new.prompt)
        best = (True, wanted.best())
        cold = (True, (0, 0))  # starts it at once, sharing nothing with it
        chosen: LaneSlots | None = None
        chosen_rank = (False, (-1, -1))
        for entry in state.free.values():  # a parked slot holds no job: its lane is free
            if not entry.parked or entry.retiring or not entry.lane.can_run(job):
                continue
            if not state.shares.policy.of(job.tenant).allows_lane(entry.lane.name):
                continue
            rank = (not entry.would_queue, entry.warmth.score(wanted))  # at once, then warmest
            if rank > chosen_rank:
                chosen, chosen_rank = entry, rank
                # None can beat it: a fleet of idle backends is not scanned. Nor can one
                # that starts it at once, cold, when no free lane is warm for it.
                if rank == best or (rank == cold and not state.warm_and_free(wanted)):
                    break
        if chosen is None:
            return None
        return chosen, chosen.parked.popleft()

    async def _hand_off(self, new: NewJob, entry: LaneSlots, parked: Parked) -> Job:
        """Queue the job as claimed by `entry`'s lane in one transaction (one commit fewer
        than queue-then-claim), start it on the parked slot's behalf and give it the run."""
        state = self._state
        state.shares.taking(new.tenant)  # before the write: submits at once see its cap
        try:
            job = await state.store.submit(new, claim_for=entry.lane.name)
        except BaseException:
            state.shares.not_taken(new.tenant)
            if not parked.started.done():
                parked.started.set_result(None)  # the slot looks at the queue again
            raise
        state.observers.job_submitted(job)
        if parked.started.done():  # the slot was stopped meanwhile: the job goes to the queue
            state.shares.not_taken(new.tenant)
            await self._recorder.give_back(job, None)
        else:
            # Started here, not by the slot once it wakes: in a burst of submits every
            # hop through the event loop waits behind all the other requests.
            parked.started.set_result(self._runner.start(entry.lane, job, parked.slot))
            # It holds a job now, though its task has not woken yet: a lane retiring
            # meanwhile must wait for it, not cancel it as idle.
            entry.idle.discard(parked.task)
            # ComfyUI sends two `status` frames as a prompt starts at once: queued, then
            # taken by its worker; `start` sent the second.
            state.queue_changed()
        return job

    def interrupt(self, prompt_id: str | None = None) -> list[str]:
        """Interrupt one running job, or every running job when no id is given."""
        running = self._state.running
        targets = [prompt_id] if prompt_id is not None else list(running)
        hit = [t for t in targets if t in running]
        for target in hit:
            running[target].handle.interrupt()
        return hit

    async def delete_pending(self, prompt_ids: Sequence[str]) -> list[str]:
        # A reserved job started a moment ago is pending in the store until its start is
        # recorded: it is running, and only `cancel` stops it.
        prompt_ids = [p for p in prompt_ids if p not in self._state.running]
        self._reservations.drop(prompt_ids)
        removed = await self._state.store.cancel(prompt_ids, pending_only=True)
        self._forget_pending(removed)
        return removed

    async def clear_pending(self) -> list[str]:
        self._reservations.drop_all()
        removed = await self._state.store.cancel_all_pending()
        self._forget_pending(removed)
        return removed

    async def cancel(self, prompt_ids: Sequence[str]) -> list[str]:
        """Cancel pending or running jobs; a running one is interrupted and ends cancelled."""
        running = self._state.running
        cancelled = await self.delete_pending([p for p in prompt_ids if p not in running])
        for prompt_id in prompt_ids:
            entry = running.get(prompt_id)
            if entry is not None:
                entry.to(AttemptState.CANCELLING)
                entry.handle.interrupt()
                cancelled.append(prompt_id)
        return cancelled

    def _forget_pending(self, removed: list[str]) -> None:
        for prompt_id in removed:
            self._streams.forget(prompt_id)
            self._state.avoid.pop(prompt_id, None)
        if removed:
            self._state.pending -= len(removed)
            self._state.queue_changed()
