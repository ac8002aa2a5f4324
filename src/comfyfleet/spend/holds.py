"""Budgets for prompts a gateway sends to backends.

A backend runs a prompt's paid jobs under its own journal, so the gateway cannot count
them job by job. Instead, as it sends a prompt whose tenant or own budget is limited,
it grants the prompt an allowance out of what those budgets leave (no more than the
prompt's counted jobs need) and holds it for the tenant in the store; the backend
refuses the job that would pass the allowance (comfyfleet.spend.allowance). Once the
backend has ended the prompt, the gateway asks it what the prompt spent there and
counts that in place of the hold. A hold not settled (the backend never said) keeps
counting in full: the budget is never passed, at worst it is under-used until the
next day.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from comfyfleet.domain.budgets import Budget, HoldRequest, Usage, day_start
from comfyfleet.domain.jobs import Job
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_large
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.spend.allowance import Allowance
from comfyfleet.spend.budget import daily_budget
from comfyfleet.spend.estimate import estimate
from comfyfleet.spend.guard import terms_from
from comfyfleet.spend.prices import PriceTable

log = logging.getLogger(__name__)

#: The route (the companion pack's, and comfyfleet's own) that says what a prompt spent.
PAID_ROUTE = "/comfyfleet/paid/{prompt_id}"


class HoldStore(Protocol):
    async def hold_paid_jobs(self, request: HoldRequest) -> Budget: ...

    async def settle_paid_jobs(self, prompt_id: str, backend: str, spent: Usage) -> bool: ...


class BackendBudgets:
    def __init__(
        self,
        store: HoldStore,
        policy: SharePolicy,
        prices: PriceTable,
        registry: NodeRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._policy = policy
        self._prices = prices
        self._registry = registry
        self._clock = clock

    def applies(self, job: Job) -> bool:
        """Whether a budget limits the prompt's paid jobs."""
        own, daily = self._budgets(job)
        return own.limited or daily.limited

    def _budgets(self, job: Job) -> tuple[Budget, Budget]:
        """The prompt's own budget (tightened by an allowance a gateway in front of this
        one granted it), and its tenant's of the day."""
        terms = terms_from(job.tenant, job.extra_data)
        own = terms.budget
        if terms.allowance is not None:
            own = own.tighter(terms.allowance.budget)
        return own, daily_budget(self._policy, job.tenant)

    async def grant(self, job: Job, backend: str) -> Allowance | None:
        """The allowance to send `job` to `backend` with (held for its tenant), or None
        when no budget limits it or it has no paid job."""
        own, daily = self._budgets(job)
        if not own.limited and not daily.limited:
            return None

        def walk() -> Any:
            return estimate(job.prompt, job.outputs, self._registry, self._prices)

        planned = await asyncio.to_thread(walk) if is_large(job.prompt) else walk()
        if planned.known and not planned.jobs:
            return None
        since = day_start(self._clock())
        wanted = planned.usage if planned.known else None
        request = HoldRequest(job.prompt_id, backend, job.tenant, daily, own, since, wanted)
        return Allowance(await self._store.hold_paid_jobs(request), self._prices)

    def on(self, backend: str, read: Callable[[str], Awaitable[Any]]) -> BackendHolds:
        return BackendHolds(self, backend, read)

    async def settle(self, prompt_id: str, backend: str, answer: Any) -> None:
        """Count what the backend says the prompt spent (`answer`, the paid route's JSON)
        in place of its hold; an answer that is not one leaves the hold counting."""
        spent = spent_from(answer)
        if spent is None:
            log.warning(
                "backend %s said nothing usable of what prompt %s spent; its hold stands",
                backend,
                prompt_id,
            )
            return
        await self._store.settle_paid_jobs(prompt_id, backend, spent)


class BackendHolds:
    """One backend's side: the prompts sent there with an allowance, whose holds are
    settled at their end by what `read` (a GET of the backend's JSON) answers. Without
    `budgets` it grants and settles nothing."""

    def __init__(
        self, budgets: BackendBudgets | None, backend: str, read: Callable[[str], Awaitable[Any]]
    ) -> None:
        self._budgets = budgets
        self._backend = backend
        self._read = read
        self._allowed: set[str] = set()

    async def allowance(self, job: Job) -> dict[str, Any] | None:
        """The `extra_data` value to send `job` with (held for its tenant), or None."""
        if self._budgets is None:
            return None
        granted = await self._budgets.grant(job, self._backend)
        if granted is None:
            return None
        self._allowed.add(job.prompt_id)
        return granted.as_json()

    async def ended(self, job: Job, *, resumed: bool = False) -> None:
        """The backend ended the prompt: settle its hold. A prompt followed again after a
        restart may have been granted one by the process before."""
        budgets = self._budgets
        if budgets is None:
            return
        if job.prompt_id in self._allowed or (resumed and budgets.applies(job)):
            path = PAID_ROUTE.format(prompt_id=urllib.parse.quote(job.prompt_id, safe=""))
            try:
                await budgets.settle(job.prompt_id, self._backend, await self._read(path))
            except ComfyfleetError as exc:  # the backend, or the store: the hold stands
                log.warning(
                    "prompt %s: its budget hold on %s stands: %s", job.prompt_id, self._backend, exc
                )
        self.forget(job.prompt_id)

    def forget(self, prompt_id: str) -> None:
        self._allowed.discard(prompt_id)


def paid_answer(prompt_id: str, used: Usage) -> dict[str, Any]:
    """The paid route's answer: the prompt's paid jobs and their cost (US dollars)."""
    return {"prompt_id": prompt_id, "paid_jobs": used.paid_jobs, "spend": round(used.spend, 9)}


def spent_from(answer: Any) -> Usage | None:
    """`{"paid_jobs": N, "spend": X}` as a Usage; None unless both are sane numbers."""
    if not isinstance(answer, dict):
        return None
    jobs, spend = answer.get("paid_jobs"), answer.get("spend")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 0 <= jobs <= 10**9:
        return None
    if isinstance(spend, bool) or not isinstance(spend, int | float) or not 0 <= spend <= 1e12:
        return None
    return Usage(jobs, float(spend))
