"""Where budgets come from: a tenant's policy, and a prompt's `extra_data` (the budgets
themselves and their arithmetic are in comfyfleet.domain.budgets)."""

from __future__ import annotations

from typing import Any

from comfyfleet.domain.budgets import PROMPT_BUDGET_KEY, Budget
from comfyfleet.errors import ComfyfleetError
from comfyfleet.shares.policy import SharePolicy

MAX_JOBS = 100_000_000
MAX_SPEND = 1_000_000_000.0


class BadBudget(ComfyfleetError, ValueError):
    """A prompt's `extra_data.comfyfleet_budget` cannot be used; the message says why."""


def daily_budget(policy: SharePolicy, tenant: str) -> Budget:
    """The tenant's budget of the day; a cap is one tenant's: `[tenants.default]` gives
    tenants no table names none."""
    found = policy.tenants.get(tenant)
    if found is None:
        return Budget()
    return Budget(found.paid_jobs_per_day, found.spend_per_day)


def prompt_budget(extra_data: Any) -> Budget:
    """The prompt's own budget from its `extra_data` (none: no limit); BadBudget says
    what is wrong."""
    raw = extra_data.get(PROMPT_BUDGET_KEY) if isinstance(extra_data, dict) else None
    if raw is None:
        return Budget()
    where = f"extra_data.{PROMPT_BUDGET_KEY}"
    if not isinstance(raw, dict) or not raw or set(raw) - {"paid_jobs", "spend"}:
        raise BadBudget(
            f'{where} must be an object with paid_jobs and/or spend, e.g. {{"paid_jobs": 4}}'
        )
    return parse_budget(raw, where)


def parse_budget(raw: dict[str, Any], where: str) -> Budget:
    """The limits `paid_jobs` and `spend` of `raw` (either may be missing or null)."""
    jobs = raw.get("paid_jobs")
    if jobs is not None and (
        isinstance(jobs, bool) or not isinstance(jobs, int) or not 0 <= jobs <= MAX_JOBS
    ):
        raise BadBudget(f"{where}.paid_jobs must be a whole number from 0 to {MAX_JOBS}")
    spend = raw.get("spend")
    if spend is not None and (
        isinstance(spend, bool) or not isinstance(spend, int | float) or not 0 <= spend <= MAX_SPEND
    ):
        raise BadBudget(f"{where}.spend must be a number of US dollars from 0 to {MAX_SPEND:g}")
    return Budget(jobs, None if spend is None else float(spend))
