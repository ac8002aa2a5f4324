"""Taking a job from the store: read candidates (claimable jobs in queue order, a small
page at a time), choose on the event loop, take the one chosen with a fenced write.

Slots here choose concurrently: a candidate another slot is taking is left to it, and
one lost to a race (another gateway took it, or it was cancelled) is passed by."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from comfyfleet.domain.jobs import DispatchKey, Job
from comfyfleet.scheduler.choosing import Verdict
from comfyfleet.scheduler.state import SchedulerState

#: How deep into the queue a claim or reservation looks for a job its lane should take.
CLAIM_DEPTH = 64
#: How many tenants' first pages a claim looks at in fair-share order before it gives up
#: (as CLAIM_DEPTH bounds the one queue's): a lane none of them has work for idles.
FAIR_DEPTH = 16
#: Candidates read at once. A page is kept and shared by the slots here until used up
#: or until a job arrives ahead of its end, so most claims read nothing; it stays small
#: so that with thousands pending few prompts are decoded for nothing.
PAGE = 16


class Candidates:
    def __init__(self, state: SchedulerState) -> None:
        self._state = state
        self._taking: set[str] = set()  # being claimed or reserved by a slot here
        # The queue's front as last read, less the jobs taken or lost since.
        self._page: list[Job] = []
        # For each read of the front under way, the places of the jobs that became
        # claimable meanwhile (None: unknown): the page read is kept only if all go after it.
        self._reads: list[list[DispatchKey | None]] = []
        self._front: asyncio.Task[list[Job]] | None = None  # a read of the front under way
        state.on_arrival = self._arrived

    async def take_first(
        self,
        choose: Callable[[Job], Verdict],
        take: Callable[[Job], Awaitable[Job | None]],
    ) -> tuple[Job | None, bool]:
        """The first candidate in queue order that `choose` takes, once `take` (a fenced
        claim or reservation) got it, and whether `choose` left any to another lane.
        With tenants sharing the fleet, the queue order is each tenant's, the tenants
        taken in their fair-share order (scheduler/fair_share.py)."""
        tenants = await self._state.shares.order(self._state.running.values())
        if tenants is not None:
            return await self._take_fair(tenants, choose, take)
        left = False
        kept = bool(self._page)
        page = list(self._page) if kept else await self._read_front()
        looked = 0
        while page:
            for job in page:
                if self._held_here(job.prompt_id):
                    continue
                verdict = choose(job)
                left = left or verdict is Verdict.LEAVE
                if verdict is Verdict.TAKE and (taken := await self._take(job, take)):
                    return taken, left
            looked += len(page)
            if looked >= CLAIM_DEPTH or (not kept and len(page) < PAGE):
                break  # deep enough, or a read came up short: that was the whole queue
            kept = False
            page = await self._state.store.candidates(PAGE, page[-1])
        return None, left

    async def _take_fair(
        self,
        tenants: list[str],
        choose: Callable[[Job], Verdict],
        take: Callable[[Job], Awaitable[Job | None]],
    ) -> tuple[Job | None, bool]:
        """The first candidate `choose` takes of the first tenant, in `tenants`' order,
        that has one (a tenant's first page only: past it, the next tenant's turn)."""
        shares, left = self._state.shares, False
        for tenant in tenants[:FAIR_DEPTH]:
            for job in await self._state.store.candidates(PAGE, tenant=tenant):
                if self._held_here(job.prompt_id):
                    continue
                verdict = choose(job)
                left = left or verdict is Verdict.LEAVE
                if verdict is not Verdict.TAKE:
                    continue
                if not shares.may_start(tenant):
                    break  # another slot here took its last place meanwhile
                shares.taking(tenant)
                taken = await self._take(job, take)
                if taken is not None:
                    return taken, left
                shares.not_taken(tenant)
        return None, left

    async def _read_front(self) -> list[Job]:
        """The queue's first page (slots that ask while it is read share the read: a
        burst of wake-ups costs the store one read, not one per slot)."""
        if self._front is None:
            self._front = asyncio.create_task(self._read_front_now(), name="queue-front")
            self._front.add_done_callback(self._front_read)
        return list(await asyncio.shield(self._front))

    def _front_read(self, task: asyncio.Task[list[Job]]) -> None:
        if self._front is task:
            self._front = None
        if not task.cancelled():
            task.exception()  # seen here, whoever waited for it

    async def _read_front_now(self) -> list[Job]:
        """The queue's first page, kept for the next claims unless a job that may go
        before its end arrived while it was read (it may or may not be in it)."""
        arrived: list[DispatchKey | None] = []
        self._reads.append(arrived)
        try:
            page = await self._state.store.candidates(PAGE)
        finally:  # by identity: another read's list may be equal to this one
            self._reads = [read for read in self._reads if read is not arrived]
        if all(_behind(key, page) for key in arrived):
            self._page = list(page)
        return page

    async def _take(self, job: Job, take: Callable[[Job], Awaitable[Job | None]]) -> Job | None:
        self._taking.add(job.prompt_id)
        try:
            taken = await take(job)
        finally:
            self._taking.discard(job.prompt_id)
        # Taken here, or gone (taken elsewhere, cancelled, moved): no longer a candidate.
        # (A write that failed leaves it: it is still pending.)
        self._page = [j for j in self._page if j.prompt_id != job.prompt_id]
        return taken

    def _arrived(self, key: DispatchKey | None) -> None:
        """A job became claimable: the kept page no longer shows the queue's front if the
        job goes before its end (unknown place: assume it does)."""
        for arrived in self._reads:
            arrived.append(key)
        if self._page and not _behind(key, self._page):
            self._page = []

    def _held_here(self, prompt_id: str) -> bool:
        """Being taken by a slot here, or taken a moment ago (a read may predate it)."""
        state = self._state
        return any(prompt_id in held for held in (self._taking, state.running, state.reserved))


def _behind(key: DispatchKey | None, page: list[Job]) -> bool:
    """A job at `key` goes after the page's last job (a page read past it misses it
    rightly: kept pages are never taken for the whole queue)."""
    return key is not None and bool(page) and key > page[-1].dispatch_key()
