"""Taking a job from the store: read candidates (claimable jobs in queue order, a small
page first), choose on the event loop, take the one chosen with a fenced write.

Slots here choose concurrently: a candidate another slot is taking is left to it, and
one lost to a race (another gateway took it, or it was cancelled) is passed by."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from comfyfleet.domain.jobs import Job
from comfyfleet.scheduler.choosing import Verdict
from comfyfleet.scheduler.state import SchedulerState

#: How deep into the queue a claim or reservation looks for a job its lane should take.
CLAIM_DEPTH = 64
#: The first page of candidates is small: the first job nearly always fits, and a page
#: of thousands of prompts would be decoded for nothing.
FIRST_PAGE = 4


class Candidates:
    def __init__(self, state: SchedulerState) -> None:
        self._state = state
        self._taking: set[str] = set()  # being claimed or reserved by a slot here

    async def take_first(
        self,
        choose: Callable[[Job], Verdict],
        take: Callable[[Job], Awaitable[Job | None]],
    ) -> tuple[Job | None, bool]:
        """The first candidate in queue order that `choose` takes, once `take` (a fenced
        claim or reservation) got it, and whether `choose` left any to another lane."""
        left = False
        after: Job | None = None
        # Past the jobs other slots here are taking: those are likely first in line.
        looked, limit = 0, FIRST_PAGE + len(self._taking)
        while looked < CLAIM_DEPTH:
            page = await self._state.store.candidates(limit, after)
            for job in page:
                if self._held_here(job.prompt_id):
                    continue
                verdict = choose(job)
                left = left or verdict is Verdict.LEAVE
                if verdict is Verdict.TAKE and (taken := await self._take(job, take)):
                    return taken, left
            looked += len(page)
            if len(page) < limit:
                break
            after = page[-1]
            limit = min(limit * 4, CLAIM_DEPTH - looked)
        return None, left

    async def _take(self, job: Job, take: Callable[[Job], Awaitable[Job | None]]) -> Job | None:
        self._taking.add(job.prompt_id)
        try:
            return await take(job)
        finally:
            self._taking.discard(job.prompt_id)

    def _held_here(self, prompt_id: str) -> bool:
        """Being taken by a slot here, or taken a moment ago (a read may predate it)."""
        state = self._state
        return any(prompt_id in held for held in (self._taking, state.running, state.reserved))
