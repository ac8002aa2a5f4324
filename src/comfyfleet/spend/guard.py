"""Budgets at run time: what the runner records with each new paid job, and checks.

The prompt's tenant and own budget come from its stored job (read once per prompt);
the journal makes the count and the insert one step (see `RemoteJobJournal.
record_remote_job`), so two gateways cannot both take a tenant's last job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from comfyfleet.domain.budgets import Budget, BudgetCheck, day_start
from comfyfleet.domain.jobs import Job
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.spend.budget import BadBudget, daily_budget, prompt_budget
from comfyfleet.spend.prices import PaidJob, PriceTable

#: Prompts whose terms are remembered (a prompt's jobs ask again and again).
REMEMBERED = 4096


class PromptLookup(Protocol):
    async def get(self, prompt_id: str) -> Job | None: ...


@dataclass(frozen=True)
class Charge:
    """What a new paid job is recorded with, and the budget check it must pass (None:
    no budget applies)."""

    tenant: str | None
    model: str
    cost: float | None
    check: BudgetCheck | None


@dataclass(frozen=True)
class _Terms:
    tenant: str
    budget: Budget


class BudgetGuard:
    def __init__(
        self,
        policy: SharePolicy,
        prices: PriceTable,
        prompts: PromptLookup,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.prices = prices
        self._prompts = prompts
        self._clock = clock
        self._terms: dict[str, _Terms | None] = {}

    async def charge(self, prompt_id: str | None, job: PaidJob) -> Charge:
        cost = self.prices.cost(job)
        terms = None if prompt_id is None else await self._terms_of(prompt_id)
        if terms is None:  # not a stored prompt's (no tenant known): no budget applies
            return Charge(None, job.model, cost, None)
        daily = daily_budget(self.policy, terms.tenant)
        check = None
        if daily.limited or terms.budget.limited:
            since = day_start(self._clock())
            check = BudgetCheck(terms.tenant, daily, terms.budget, since, cost)
        return Charge(terms.tenant, job.model, cost, check)

    async def _terms_of(self, prompt_id: str) -> _Terms | None:
        if prompt_id in self._terms:
            return self._terms[prompt_id]
        found = await self._prompts.get(prompt_id)
        terms = None
        if found is not None:
            try:
                budget = prompt_budget(found.extra_data)
            except BadBudget:  # refused at submit; one stored before budgets: none
                budget = Budget()
            terms = _Terms(found.tenant, budget)
        if len(self._terms) >= REMEMBERED:
            self._terms.pop(next(iter(self._terms)))
        self._terms[prompt_id] = terms
        return terms
