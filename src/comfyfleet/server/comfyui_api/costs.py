"""Paid-job budgets at submit, and the cost dry run's answer (`POST /comfyfleet/cost`).

A prompt whose paid jobs can be counted from its graph (see comfyfleet.spend.estimate)
is refused at submit when they would pass its tenant's budget of the day or its own
(`extra_data.comfyfleet_budget`): 400, `budget_exceeded`, and no job is sent. One whose
count is known only as it runs is checked job by job then (comfyfleet.spend.guard).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from comfyfleet.domain.budgets import (
    ALLOWANCE,
    PROMPT,
    Budget,
    Usage,
    day_start,
    overrun,
    tenant_owner,
)
from comfyfleet.engine.validation import ValidationResult
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.protocol.prompt import is_large
from comfyfleet.server.gateway import Gateway
from comfyfleet.spend.allowance import allowance_of
from comfyfleet.spend.budget import BadBudget, daily_budget, prompt_budget
from comfyfleet.spend.estimate import Estimate, estimate, without_reused


def bad_budget(message: str) -> web.Response:
    body = prompt_error_body(error("invalid_budget", "The prompt's budget is not valid", message))
    return web.json_response(body, status=400)


async def estimated(gw: Gateway, checked: ValidationResult) -> Estimate:
    """The new paid jobs of a validated prompt: those the journal holds are reused (the
    graph walked in a worker thread when it is large)."""

    def walk() -> Estimate:
        return estimate(checked.prompt, checked.outputs, gw.engine.registry, gw.config.prices)

    planned = await asyncio.to_thread(walk) if is_large(checked.prompt) else walk()
    return await without_reused(planned, gw.store)


async def budget_refusal(
    gw: Gateway, checked: ValidationResult, extra_data: dict[str, Any], tenant: str
) -> web.Response | None:
    """The 400 for a prompt whose counted paid jobs would pass a budget, or None."""
    try:
        own, granted = prompt_budget(extra_data), allowance_of(extra_data)
    except BadBudget as exc:
        return bad_budget(str(exc))
    allowance = Budget() if granted is None else granted.budget
    daily = daily_budget(gw.config.shares, tenant)
    if not own.limited and not daily.limited and not allowance.limited:
        return None
    planned = await estimated(gw, checked)
    if not planned.known or not planned.jobs:
        return None  # counted job by job as it runs
    used = Usage()
    if daily.limited:
        used = await gw.store.paid_usage(tenant, day_start(time.time()))
    why = (
        _overrun(daily, used, planned, tenant_owner(tenant))
        or _overrun(own, Usage(), planned, PROMPT)
        or _overrun(allowance, Usage(), planned, ALLOWANCE)
    )
    if why is None:
        return None
    err = error(
        "budget_exceeded",
        "The prompt's paid jobs would pass a budget; nothing was sent",
        why,
        paid_jobs=planned.usage.paid_jobs,
    )
    return web.json_response(prompt_error_body(err), status=400)


def _overrun(budget: Budget, used: Usage, planned: Estimate, owner: str) -> str | None:
    if not planned.costs_known:  # what it spends is known only as it runs
        budget = Budget(budget.paid_jobs, None)
    return overrun(budget, used, planned.usage, owner)


async def cost_answer(
    gw: Gateway, checked: ValidationResult, extra_data: dict[str, Any], tenant: str
) -> dict[str, Any] | web.Response:
    """The dry run's answer for a validated prompt: what it would send (provider, model,
    count) and cost by the price table, and where its tenant's budget of the day stands;
    or the 400 of a bad prompt budget. Nothing is queued or sent."""
    try:
        own = prompt_budget(extra_data)
    except BadBudget as exc:
        return bad_budget(str(exc))
    planned = await estimated(gw, checked)
    daily = daily_budget(gw.config.shares, tenant)
    used = await gw.store.paid_usage(tenant, day_start(time.time()))
    refusal = None
    if planned.known:
        refusal = _overrun(daily, used, planned, tenant_owner(tenant)) or _overrun(
            own, Usage(), planned, PROMPT
        )
    answer = planned.as_json()
    answer["budget"] = {
        "tenant": tenant,
        "paid_jobs_per_day": daily.paid_jobs,
        "spend_per_day": daily.spend,
        "today": {"paid_jobs": used.paid_jobs, "spend": round(used.spend, 6)},
        "prompt": {"paid_jobs": own.paid_jobs, "spend": own.spend},
        "refusal": refusal,
    }
    return answer
