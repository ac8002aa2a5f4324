"""Budgets at run time: what the runner records with each new paid job, and checks.

A prompt's terms (its tenant, its own budget, the allowance of a gateway that sent it
here) come from its stored job, read once per prompt, or inside ComfyUI from what the
prompt was queued with (comfyfleet.in_comfyui.allowances). The journal makes the
count and the insert one step (see `RemoteJobJournal.record_remote_job`), so two
gateways cannot both take a tenant's last job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from comfyfleet.domain.budgets import Budget, BudgetCheck, day_start
from comfyfleet.domain.jobs import Job
from comfyfleet.shares.policy import SharePolicy
from comfyfleet.spend.allowance import Allowance, allowance_of
from comfyfleet.spend.budget import BadBudget, daily_budget, prompt_budget
from comfyfleet.spend.prices import PaidJob, PriceTable

NO_BUDGET = Budget()
#: Prompts whose terms are remembered (a prompt's jobs ask again and again).
REMEMBERED = 4096


class PromptLookup(Protocol):
    async def get(self, prompt_id: str) -> Job | None: ...


@dataclass(frozen=True)
class PromptTerms:
    """What budgets a prompt's paid jobs count against: its tenant's of the day (None: no
    tenant here), its own, and the allowance of the gateway that sent it."""

    tenant: str | None
    budget: Budget = NO_BUDGET
    allowance: Allowance | None = None


class TermsLookup(Protocol):
    async def terms_of(self, prompt_id: str) -> PromptTerms | None: ...


@dataclass(frozen=True)
class Charge:
    """What a new paid job is recorded with, and the budget check it must pass (None:
    no budget applies)."""

    tenant: str | None
    model: str
    cost: float | None
    check: BudgetCheck | None


class StoredPromptTerms:
    """Prompts' terms from their stored jobs, read once per prompt."""

    def __init__(self, prompts: PromptLookup) -> None:
        self._prompts = prompts
        self._terms: dict[str, PromptTerms | None] = {}

    async def terms_of(self, prompt_id: str) -> PromptTerms | None:
        if prompt_id in self._terms:
            return self._terms[prompt_id]
        found = await self._prompts.get(prompt_id)
        terms = None if found is None else terms_from(found.tenant, found.extra_data)
        if len(self._terms) >= REMEMBERED:
            self._terms.pop(next(iter(self._terms)))
        self._terms[prompt_id] = terms
        return terms


def terms_from(tenant: str | None, extra_data: Any) -> PromptTerms:
    """A prompt's terms from its `extra_data`; a bad budget or allowance counts as none
    (refused at submit; one stored before budgets existed has none)."""
    try:
        budget = prompt_budget(extra_data)
    except BadBudget:
        budget = Budget()
    try:
        allowance = allowance_of(extra_data)
    except BadBudget:
        allowance = None
    return PromptTerms(tenant, budget, allowance)


class BudgetGuard:
    def __init__(
        self,
        policy: SharePolicy,
        prices: PriceTable,
        prompts: TermsLookup,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.prices = prices
        self._prompts = prompts
        self._clock = clock

    async def charge(self, prompt_id: str | None, job: PaidJob) -> Charge:
        terms = None if prompt_id is None else await self._prompts.terms_of(prompt_id)
        allowance = None if terms is None else terms.allowance
        prices = self.prices if allowance is None or allowance.prices is None else allowance.prices
        cost = prices.cost(job)
        if terms is None:  # not a known prompt's: no budget applies
            return Charge(None, job.model, cost, None)
        daily = Budget() if terms.tenant is None else daily_budget(self.policy, terms.tenant)
        granted = Budget() if allowance is None else allowance.budget
        check = None
        if daily.limited or terms.budget.limited or granted.limited:
            since = day_start(self._clock())
            tenant = terms.tenant or ""
            check = BudgetCheck(tenant, daily, terms.budget, since, cost, granted)
        return Charge(terms.tenant, job.model, cost, check)
