"""Budget arithmetic: what passes a budget, the day's start, and the prompt's own budget."""

from __future__ import annotations

import math

import pytest

from comfyfleet.domain.budgets import (
    PROMPT,
    Budget,
    Usage,
    day_start,
    may_be_billed,
    one_job,
    overrun,
    tenant_owner,
)
from comfyfleet.domain.remote_jobs import RemoteJob, RemoteJobState
from comfyfleet.spend.budget import BadBudget, prompt_budget

ALICE = tenant_owner("alice")


def test_a_job_cap_allows_exactly_its_number() -> None:
    budget = Budget(paid_jobs=30)
    assert overrun(budget, Usage(29), one_job(0.04), ALICE) is None
    why = overrun(budget, Usage(30), one_job(0.04), ALICE)
    assert why == (
        "tenant alice's paid_jobs_per_day (today, UTC) = 30: 30 paid job(s) counted, "
        "1 more asked for"
    )
    assert overrun(budget, Usage(0), Usage(31), ALICE) is not None  # a prompt of 31
    assert overrun(Budget(paid_jobs=0), Usage(), one_job(None), ALICE) is not None


def test_spend_is_summed_without_refusing_on_rounding() -> None:
    budget = Budget(spend=0.3)
    # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floating point: still within 0.3.
    assert overrun(budget, Usage(2, 0.1 + 0.1), one_job(0.1), ALICE) is None
    why = overrun(budget, Usage(3, 0.3), one_job(0.01), ALICE)
    assert why is not None and why.startswith("tenant alice's spend_per_day (today, UTC) = 0.3")


def test_a_spend_limit_refuses_a_job_without_a_price() -> None:
    why = overrun(Budget(spend=100.0), Usage(), one_job(None), PROMPT)
    assert why == (
        "the prompt's extra_data.comfyfleet_budget.spend = 100: "
        "a job's model has no price in [prices]"
    )
    assert overrun(Budget(paid_jobs=5), Usage(), one_job(None), PROMPT) is None  # jobs only


def test_no_limit_passes_anything() -> None:
    assert not Budget().limited
    assert overrun(Budget(), Usage(10**6, 10**6), Usage(10**6, 10**6), ALICE) is None


def test_a_day_starts_at_midnight_utc() -> None:
    noon = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    start = day_start(noon)
    assert start == 1_799_971_200.0 and start % 86400 == 0
    assert day_start(start) == start
    assert day_start(start - 0.001) == start - 86400


@pytest.mark.parametrize(
    ("extra", "budget"),
    [
        ({}, Budget()),
        ({"comfyfleet_budget": {"paid_jobs": 4}}, Budget(4, None)),
        ({"comfyfleet_budget": {"spend": 2}}, Budget(None, 2.0)),
        ({"comfyfleet_budget": {"paid_jobs": 0, "spend": 0.5}}, Budget(0, 0.5)),
    ],
)
def test_a_prompts_budget_is_read_from_extra_data(extra: dict[str, object], budget: Budget) -> None:
    assert prompt_budget(extra) == budget


@pytest.mark.parametrize(
    "raw",
    [
        5,
        {},
        {"jobs": 3},
        {"paid_jobs": -1},
        {"paid_jobs": 2.5},
        {"paid_jobs": True},
        {"paid_jobs": "3"},
        {"spend": -0.01},
        {"spend": math.inf},
        {"spend": math.nan},
        {"spend": "1"},
    ],
)
def test_a_bad_prompt_budget_says_what_is_wrong(raw: object) -> None:
    with pytest.raises(BadBudget, match=r"extra_data\.comfyfleet_budget"):
        prompt_budget({"comfyfleet_budget": raw})


def _job(state: RemoteJobState, remote_id: str | None, error_class: str | None) -> RemoteJob:
    error = None if error_class is None else {"class": error_class, "message": "m", "status": None}
    return RemoteJob(
        "j", "h", "bfl", "image", "p", "1", None, state, remote_id, {}, error, 1, 0.0, 0.0
    )


def test_only_a_job_the_provider_never_took_goes_uncounted() -> None:
    assert may_be_billed(_job(RemoteJobState.SUBMITTING, None, None))
    assert may_be_billed(_job(RemoteJobState.RUNNING, "t", None))
    assert may_be_billed(_job(RemoteJobState.SUCCEEDED, None, None))  # synchronous APIs
    assert may_be_billed(_job(RemoteJobState.FAILED, "t", "JobFailed"))
    assert may_be_billed(_job(RemoteJobState.FAILED, None, "AmbiguousSubmit"))
    assert may_be_billed(_job(RemoteJobState.CANCELLED, None, None))
    assert not may_be_billed(_job(RemoteJobState.FAILED, None, "ProviderError"))
