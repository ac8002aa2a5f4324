"""Recovery: what a gateway finds when it starts (its own jobs from before a restart,
and those of gateways that are gone), the prompts a backend still holds for it, and
the lease that keeps its jobs its own while it lives; once another gateway's lease has
run out, its jobs are taken over here (re-queued, or adopted and followed)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from comfyfleet.domain.gateways import next_look
from comfyfleet.domain.jobs import DispatchKey, Job, JobStatus, hold_seconds
from comfyfleet.lanes.base import Lane
from comfyfleet.scheduler.reservations import Reservations
from comfyfleet.scheduler.runner import Runner
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.store.base import StoreError

log = logging.getLogger(__name__)

#: Leases a gone gateway's job set aside for a backend this gateway does not have is
#: left to the gateway that has it (it follows it there), before it goes back to the queue.
UNOWNED_GRACE = 3


class Recovery:
    def __init__(
        self,
        state: SchedulerState,
        runner: Runner,
        reservations: Reservations,
        lease: float,
    ) -> None:
        self._state = state
        self._runner = runner
        self._reservations = reservations
        self.lease = lease  # this gateway's lease on its jobs (`store.join` made it)
        self._keeper: asyncio.Task[None] | None = None
        self._unowned: dict[str, float] = {}  # set aside for a lane not here: since when
        self._recovered = False  # `recover` has run: lanes added from now on recover alone

    async def recover(self) -> None:
        """Before the slots start: follow or re-queue what was running here (or for a
        gateway that is gone), and recount the pending jobs."""
        state, store = self._state, self._state.store
        running, pending = await store.queue()
        # A gateway's prompts wait for it to say which it still wants (it may have moved
        # them while this process was down).
        state.holds.recovered(j.prompt_id for j in running + pending if hold_seconds(j.extra_data))
        # Of what the store holds, this gateway's own (from before a restart) and orphans:
        # never another live gateway's.
        orphans = {job.prompt_id for job in await store.orphaned()}

        def ours(job: Job) -> bool:
            # Other gateways' jobs wait for the lease keeper, once this one has held its
            # own lease a whole lease (they may be alive and not yet renewed).
            orphan = job.prompt_id in orphans and state.lease.may_sweep()
            return job.owner == store.owner or orphan

        running = [job for job in running if ours(job)]
        running += await self._recover_reserved([j for j in pending if j.lane and ours(j)])
        await self._recall_avoided([job for job in pending if job.attempt > 0])
        for entry in state.lanes.values():
            await self._recover(entry.lane, [job for job in running if job.lane == entry.lane.name])
        state.pending = (await store.counts()).get(JobStatus.PENDING, 0)
        self._recovered = True

    async def recover_lane(self, lane: Lane) -> None:
        """A backend's lane added after the start (a backend this gateway took over, a
        worker that joined): what this gateway recorded running there before a restart,
        and no one here follows, is followed now (its end read from the backend), as
        `recover` does for the lanes it starts with."""
        state, store = self._state, self._state.store
        if not self._recovered or lane.in_process:
            return
        try:
            running, _total = await store.jobs(statuses=[JobStatus.RUNNING], newest_first=False)
        except StoreError as exc:  # the lane works on; what it ran is not followed
            log.warning("lane %s: could not read what ran there: %s", lane.name, exc)
            return
        await self._recover(
            lane,
            [
                job
                for job in running
                if job.lane == lane.name
                and job.owner == store.owner
                and job.prompt_id not in state.running
            ],
        )

    async def _recover(self, lane: Lane, jobs: list[Job]) -> None:
        """Jobs recorded as running on `lane` when the gateway stopped."""
        store = self._state.store
        if lane.in_process:
            requeued = await store.requeue_lane(lane.name)
            if requeued:
                log.info("re-queued %d jobs that were running on %s", len(requeued), lane.name)
            return
        for job in jobs:
            # Another gateway's (it died): this one's now, the old owner fenced out.
            adopted = job if job.owner == store.owner else await store.adopt(job)
            if adopted is not None:
                self._runner.follow(lane, adopted)

    async def _recall_avoided(self, requeued: list[Job]) -> None:
        """Re-queued jobs keep leaving the lanes they were given back from (failed there,
        or taken back from there) across a restart: the reasons are in the store."""
        notes_of = await self._state.store.attempt_notes_of([job.prompt_id for job in requeued])
        for prompt_id, notes in notes_of.items():
            lanes = frozenset(note["lane"] for _, note in notes if note.get("lane"))
            if lanes:
                self._state.avoid[prompt_id] = lanes

    async def _recover_reserved(self, jobs: list[Job]) -> list[Job]:
        """Jobs reserved when the gateway stopped: one may have been submitted to its
        lane's backend before its start was recorded, so each is treated as running
        there (and asked after); those of lanes that are gone go back to the queue."""
        store = self._state.store
        running, back = [], []
        for job in jobs:
            entry = self._state.lanes.get(job.lane or "")
            started = None
            if entry is not None and not entry.lane.in_process:
                started = await store.start_reserved(job, entry.lane.name)
            if started is not None:
                running.append(started)
            else:
                back.append(job.prompt_id)
        await store.unreserve(back)
        return running

    async def adopt(self, lane: Lane, found: Sequence[str]) -> set[str]:
        """Of the prompts `lane`'s backend holds for this gateway, those to stay there:
        the jobs running there (or set aside for it), and re-queued jobs no other lane
        has taken since, started on `lane` now and followed there (not run twice)."""
        state = self._state
        keep: set[str] = set()
        for prompt_id in found:
            running = state.running.get(prompt_id)
            job = running.job if running is not None else await state.store.get(prompt_id)
            if job is None or job.lane not in (None, lane.name):
                continue
            if job.status == JobStatus.RUNNING:
                keep.add(prompt_id)
            elif job.status == JobStatus.PENDING and prompt_id not in state.running:
                started = await state.store.start_reserved(job, lane.name)
                if started is not None:
                    keep.add(prompt_id)
                    state.reserved.pop(prompt_id)
                    state.avoid.pop(prompt_id, None)
                    state.pending -= 1
                    self._runner.follow(lane, started)
        return keep

    # -- several gateways ---------------------------------------------------------

    def work_elsewhere(self, owner: str, key: DispatchKey | None) -> None:
        """Another gateway queued (or gave back) a job, at `key` in the queue if known:
        idle slots here look too. It is counted until the next recount, whoever claims
        it."""
        state = self._state
        if owner != state.store.owner and not state.stopping:
            state.pending += 1
            state.work_arrived(key)

    def keep_lease(self) -> None:
        self._keeper = asyncio.create_task(self._keep_lease(), name="lease")

    async def stop_keeping(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)

    async def _keep_lease(self) -> None:
        """Renew this gateway's lease; take over what gateways whose lease ran out left."""
        state, store = self._state, self._state.store
        wait = self.lease / 3
        while True:
            await asyncio.sleep(wait)
            wait = self.lease / 3
            try:
                sent_at = state.lease.now()
                if await store.heartbeat(self.lease):
                    state.lease.renewed(sent_at)
                else:
                    log.error(
                        "gateway id %s is now another process's: give each gateway an id "
                        "of its own (--gateway-id)",
                        store.owner,
                    )
                live = await store.gateways()
                wait = next_look(store.owner, live, self.lease, time.time())
                await self.take_over_orphans()
                if len(live) > 1 or state.running_elsewhere:  # the others' jobs count too
                    before = state.queue_remaining
                    if await state.recount() != before:
                        state.queue_changed()
            except StoreError as exc:
                state.lease.failed()
                log.warning("could not renew the lease of gateway %s: %s", store.owner, exc)

    async def take_over_orphans(self) -> None:
        """Jobs of gateways that are gone: a run on a lane of this gateway's kind is
        re-queued (in-process) or adopted and followed (a backend's), a reservation
        given back. A lane this gateway does not have is left to one that has it. Not
        before this gateway may sweep (see scheduler/lease.py): a gateway whose lease ran
        out may be alive and about to renew it."""
        state, store = self._state, self._state.store
        if not state.lease.may_sweep():
            return
        orphans = await store.orphaned()
        ids = {job.prompt_id for job in orphans}
        self._unowned = {p: since for p, since in self._unowned.items() if p in ids}
        for job in orphans:
            if job.owner == store.owner or job.prompt_id in state.running:
                continue
            if job.status == JobStatus.PENDING:
                await self._take_over_reserved(job)
                continue
            entry = state.lanes.get(job.lane or "")
            if entry is None or entry.retiring:
                continue
            if entry.lane.in_process:
                if await store.requeue_orphaned(job):
                    log.info("re-queued %s: gateway %s is gone", job.prompt_id, job.owner)
                    state.pending += 1
                    state.observers.job_requeued(job, {"kind": "orphaned", "from": job.owner})
                    state.work_arrived(job.dispatch_key())
            elif (adopted := await store.adopt(job)) is not None:
                log.info("following %s: gateway %s is gone", job.prompt_id, job.owner)
                self._runner.follow(entry.lane, adopted)

    async def _take_over_reserved(self, job: Job) -> None:
        """A job a gateway that is gone set aside. One set aside for a backend may have
        been sent there before its start was recorded, and run: the gateway that has
        that backend's lane starts it there and follows it (its end read from there,
        as after a restart); the others leave it to that one for UNOWNED_GRACE leases,
        then give it back to the queue, as they do one set aside for an in-process lane."""
        state, store = self._state, self._state.store
        entry = state.lanes.get(job.lane or "")
        if entry is not None and not entry.lane.in_process:
            if entry.retiring:
                return
            started = await store.start_reserved(job, entry.lane.name)
            if started is not None:
                log.info(
                    "following %s: set aside by gateway %s, which is gone", job.prompt_id, job.owner
                )
                state.pending -= 1
                self._runner.follow(entry.lane, started)
            return
        if entry is None and job.lane is not None:
            first = self._unowned.setdefault(job.prompt_id, time.monotonic())
            if time.monotonic() - first < UNOWNED_GRACE * self.lease:
                return
        self._unowned.pop(job.prompt_id, None)
        await self._reservations.unreserve([job.prompt_id])
