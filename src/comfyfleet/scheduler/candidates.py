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
#: Candidates read at once. Pages read from the queue's front on are kept and shared by
#: the slots here (the window) until used up or until a job arrives ahead of their end,
#: so most claims read nothing; a page stays small so that with thousands pending few
#: prompts are decoded for nothing.
PAGE = 16


class Candidates:
    def __init__(self, state: SchedulerState) -> None:
        self._state = state
        self._taking: set[str] = set()  # being claimed or reserved by a slot here
        # The queue's front as last read (a page, or pages read one after the other),
        # less the jobs taken or lost since; `_end` is where the last page read ended.
        self._page: list[Job] = []
        self._end: Job | None = None
        # For each read under way, the places of the jobs that became claimable meanwhile
        # (None: unknown): the page read joins the window only if all go after it.
        self._reads: list[list[DispatchKey | None]] = []
        # The reads under way, by the prompt id they read after ("": the front): the
        # slots that ask for one page at once share one read.
        self._reading: dict[str, asyncio.Task[list[Job]]] = {}
        state.on_arrival = self._arrived

    async def take_first(
        self,
        choose: Callable[[Job], Verdict],
        take: Callable[[Job], Awaitable[Job | None]],
        only_tenant: str | None = None,
    ) -> tuple[Job | None, bool]:
        """The first candidate in queue order that `choose` takes, once `take` (a fenced
        claim or reservation) got it, and whether `choose` left any to another lane.
        With tenants sharing the fleet, the queue order is each tenant's, the tenants
        taken in their fair-share order (scheduler/fair_share.py); a lane of one tenant
        (`only_tenant`) reads only that tenant's queue."""
        if only_tenant is not None:
            return await self._take_fair([only_tenant], choose, take)
        tenants = await self._state.shares.order(self._state.running.values())
        if tenants is not None:
            return await self._take_fair(tenants, choose, take)
        left = False
        kept = bool(self._page)
        page = list(self._page) if kept else await self._read(None)
        # Where the next page starts: past the window (its last jobs may be taken).
        end = self._end if kept else None
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
            page = await self._read(end or page[-1])
            end = None
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

    async def _read(self, after: Job | None) -> list[Job]:
        """The page of candidates after `after` (None: the queue's first page). Slots that
        ask for the same page while it is read share the read: a burst of wake-ups, or a
        thousand busy backends setting their next jobs aside, costs the store one read
        per page, not one per slot."""
        key = "" if after is None else after.prompt_id
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read_now(after), name="queue-page")
            self._reading[key] = task
            task.add_done_callback(lambda done: self._page_read(key, done))
        return list(await asyncio.shield(task))

    def _page_read(self, key: str, task: asyncio.Task[list[Job]]) -> None:
        if self._reading.get(key) is task:
            del self._reading[key]
        if not task.cancelled():
            task.exception()  # seen here, whoever waited for it

    async def _read_now(self, after: Job | None) -> list[Job]:
        """A page, kept in the window for the next claims when it starts the queue or
        follows where the window ends, unless a job that may go before its end arrived
        while it was read (it may or may not be in it)."""
        arrived: list[DispatchKey | None] = []
        self._reads.append(arrived)
        try:
            page = await self._state.store.candidates(PAGE, after)
        finally:  # by identity: another read's list may be equal to this one
            self._reads = [read for read in self._reads if read is not arrived]
        if not page or not all(_behind(key, page[-1].dispatch_key()) for key in arrived):
            return page
        if after is None:
            self._page, self._end = list(page), page[-1]
        elif self._end is not None and after.prompt_id == self._end.prompt_id:
            self._page.extend(job for job in page if not self._held_here(job.prompt_id))
            self._end = page[-1]
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
        if self._end is not None and not _behind(key, self._end.dispatch_key()):
            self._page, self._end = [], None

    def _held_here(self, prompt_id: str) -> bool:
        """Being taken by a slot here, or taken a moment ago (a read may predate it)."""
        state = self._state
        return any(prompt_id in held for held in (self._taking, state.running, state.reserved))


def _behind(key: DispatchKey | None, end: DispatchKey) -> bool:
    """A job at `key` goes after `end`, where the pages read end (a page read past it
    misses it rightly: kept pages are never taken for the whole queue)."""
    return key is not None and key > end
