"""Budgets of paid jobs, and the arithmetic that says whether one more would pass one
(the records fan-out and the store's journal exchange; see comfyfleet.spend).

A tenant's budget (`paid_jobs_per_day`, `spend_per_day` in `[tenants.NAME]`) counts the
jobs its prompts sent since 00:00 UTC (a calendar day in UTC, the same for every
gateway). A prompt's budget (`extra_data.comfyfleet_budget`) counts that prompt's jobs.
A job counts when it may have been billed: from the moment it is recorded, unless it
ended failed without a remote id and without an ambiguous submit (the provider refused
it or never got it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from comfyfleet.domain.remote_jobs import RemoteJob, RemoteJobState
from comfyfleet.errors import ComfyfleetError

#: The key of a prompt's own budget in its `extra_data`.
PROMPT_BUDGET_KEY = "comfyfleet_budget"
DAY = 86400.0


class BudgetExceeded(ComfyfleetError):
    """A paid job would pass a budget; nothing was sent. The message names the budget."""


@dataclass(frozen=True)
class Budget:
    """At most `paid_jobs` jobs and `spend` US dollars (None: no limit)."""

    paid_jobs: int | None = None
    spend: float | None = None

    @property
    def limited(self) -> bool:
        return self.paid_jobs is not None or self.spend is not None

    def tighter(self, other: Budget) -> Budget:
        """Both budgets at once: the lower of each limit."""
        jobs = [n for n in (self.paid_jobs, other.paid_jobs) if n is not None]
        spend = [x for x in (self.spend, other.spend) if x is not None]
        return Budget(min(jobs) if jobs else None, min(spend) if spend else None)


@dataclass(frozen=True)
class Usage:
    """Jobs and their cost; `unpriced` of the jobs have no price (their cost is unknown)."""

    paid_jobs: int = 0
    spend: float = 0.0
    unpriced: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.paid_jobs + other.paid_jobs,
            self.spend + other.spend,
            self.unpriced + other.unpriced,
        )


def may_be_billed(job: RemoteJob) -> bool:
    """Whether a journaled job counts: all but one that failed with no remote id and no
    ambiguous submit (the provider refused it, or never got it). The stores' SQL says
    the same (journal_paid_by_tenant)."""
    if job.state != RemoteJobState.FAILED or job.remote_id is not None:
        return True
    return (job.error or {}).get("class") == "AmbiguousSubmit"


def one_job(cost: float | None) -> Usage:
    return Usage(1, cost or 0.0, 1 if cost is None else 0)


def overrun(budget: Budget, used: Usage, adding: Usage, owner: str) -> str | None:
    """Why `adding` to `used` passes `budget`, named as `owner`'s (e.g. "tenant alice's"),
    or None. A spend limit needs a price for every job added: without one the job is
    refused, since what it would cost is unknown."""
    total = used + adding
    jobs_name, spend_name = _names(owner)
    if budget.paid_jobs is not None and total.paid_jobs > budget.paid_jobs:
        return (
            f"{jobs_name} = {budget.paid_jobs}: {used.paid_jobs} paid job(s) counted, "
            f"{adding.paid_jobs} more asked for"
        )
    if budget.spend is None:
        return None
    if adding.unpriced:
        return f"{spend_name} = {budget.spend:g}: a job's model has no price in [prices]"
    if total.spend > budget.spend + 1e-9:  # sums of prices: no refusal by a rounding error
        return (
            f"{spend_name} = {budget.spend:g}: ${used.spend:.4g} counted, "
            f"${adding.spend:.4g} more asked for"
        )
    return None


def _names(owner: str) -> tuple[str, str]:
    if owner == PROMPT:
        return f"{PROMPT} extra_data.{PROMPT_BUDGET_KEY}.paid_jobs", (
            f"{PROMPT} extra_data.{PROMPT_BUDGET_KEY}.spend"
        )
    if owner == ALLOWANCE:
        where = f"extra_data.{ALLOWANCE_KEY}"
        return f"{ALLOWANCE} ({where}.paid_jobs)", f"{ALLOWANCE} ({where}.spend)"
    return f"{owner} paid_jobs_per_day (today, UTC)", f"{owner} spend_per_day (today, UTC)"


#: The owner name of a prompt's own budget in messages.
PROMPT = "the prompt's"
#: The key of the allowance a gateway grants a prompt it sends to a backend, and its
#: owner name in messages (see comfyfleet.spend.allowance).
ALLOWANCE_KEY = "comfyfleet_allowance"
ALLOWANCE = "the prompt's allowance from its gateway"


def tenant_owner(tenant: str) -> str:
    return f"tenant {tenant}'s"


@dataclass(frozen=True)
class BudgetCheck:
    """What the journal checks, in the write that records a new paid job: the tenant's
    jobs since `since` and the prompt's own jobs, plus this one, within their budgets."""

    tenant: str
    tenant_budget: Budget
    prompt_budget: Budget
    since: float  # 00:00 UTC today
    cost: float | None  # this job's
    allowance: Budget = Budget()  # from the gateway that sent the prompt here

    @property
    def counts_prompt(self) -> bool:
        """Whether the prompt's own jobs have to be counted."""
        return self.prompt_budget.limited or self.allowance.limited

    def refusal(self, tenant_used: Usage, prompt_used: Usage) -> str | None:
        adding = one_job(self.cost)
        return (
            overrun(self.tenant_budget, tenant_used, adding, tenant_owner(self.tenant))
            or overrun(self.prompt_budget, prompt_used, adding, PROMPT)
            or overrun(self.allowance, prompt_used, adding, ALLOWANCE)
        )


def day_start(now: float) -> float:
    """00:00 UTC of the day `now` is in: where a tenant's daily budget starts counting."""
    return math.floor(now / DAY) * DAY


@dataclass(frozen=True)
class HoldRequest:
    """A prompt about to run on a backend, whose own journal counts its paid jobs: the
    gateway grants it an allowance out of its budgets and holds that for its tenant
    until the backend says what the prompt spent (see comfyfleet.spend.holds).

    `wanted` is the prompt's counted jobs and their cost (None: known only as it runs).
    `earlier` in the methods is what this prompt's earlier hold on the same backend
    stood at (what it spent there, once settled): the backend's count includes it."""

    prompt_id: str
    backend: str
    tenant: str
    tenant_budget: Budget
    prompt_budget: Budget
    since: float  # 00:00 UTC today
    wanted: Usage | None

    def grant(
        self, tenant_used: Usage, prompt_used: Usage, earlier: Usage, earlier_today: bool
    ) -> tuple[Budget, Usage]:
        """The allowance, and what the hold counts from now on. `*_used` are the counts
        with the earlier hold in them (the tenant's only if it is of today): a new grant
        takes its place."""
        if earlier_today:
            tenant_used = _less(tenant_used, earlier)
        allowance = self.allowance(tenant_used, _less(prompt_used, earlier), earlier)
        return allowance, self.held(allowance, earlier)

    def allowance(self, tenant_used: Usage, prompt_used: Usage, earlier: Usage) -> Budget:
        """At most what the budgets leave (`*_used` leave this hold out) and, where a
        budget limits, no more than the prompt is known to need."""
        wanted = self.wanted
        jobs = _least(
            _left(self.tenant_budget.paid_jobs, tenant_used.paid_jobs),
            _left(self.prompt_budget.paid_jobs, prompt_used.paid_jobs),
        )
        if jobs is not None and wanted is not None:
            jobs = min(jobs, earlier.paid_jobs + wanted.paid_jobs)
        spend = _least(
            _left(self.tenant_budget.spend, tenant_used.spend),
            _left(self.prompt_budget.spend, prompt_used.spend),
        )
        if spend is not None and wanted is not None and not wanted.unpriced:
            spend = min(spend, earlier.spend + wanted.spend)
        return Budget(None if jobs is None else int(jobs), spend)

    def held(self, allowance: Budget, earlier: Usage) -> Usage:
        """What the hold counts for the tenant until it is settled: the allowance, or
        where it has no limit, what the prompt is known to need."""
        expected = earlier if self.wanted is None else earlier + self.wanted
        jobs = expected.paid_jobs if allowance.paid_jobs is None else allowance.paid_jobs
        spend = expected.spend if allowance.spend is None else allowance.spend
        return Usage(jobs, spend)


def _less(used: Usage, hold: Usage) -> Usage:
    return Usage(
        max(0, used.paid_jobs - hold.paid_jobs), max(0.0, used.spend - hold.spend), used.unpriced
    )


def _left(limit: float | None, used: float) -> float | None:
    return None if limit is None else max(0.0, limit - used)


def _least(*limits: float | None) -> float | None:
    present = [limit for limit in limits if limit is not None]
    return min(present) if present else None
