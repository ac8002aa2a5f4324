"""A v2 submit's own paid-job budget (`extra_data.comfyfleet_budget`), against the
provider emulator: checked at submit as `POST /prompt` checks it, refused in v2's
envelope when bad, and kept with the job so the run-time guard enforces it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.emulators import Emulator
from tests.integration.api_v2.conftest import Served
from tests.integration.api_v2.test_http import assert_error, queued
from tests.integration.fanout.conftest import KEY, KEY_ENV, start_emulator
from tests.integration.fanout.test_budgets import fanout, jobs_sent, listed

JOBS = "/api/v2/jobs"


@pytest.fixture
async def emulator(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Emulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the server's key vault reads its environment
    started = await start_emulator(latency=0.05)
    yield started
    await started.server.close()


def budgeted(workflow: dict[str, Any], budget: Any) -> dict[str, Any]:
    return {"workflow": workflow, "extra_data": {"comfyfleet_budget": budget}}


async def ended(served: Served, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The v2 Job once it has ended."""
    async with asyncio.timeout(timeout):
        while True:
            _, _, job = await served.call("GET", f"{JOBS}/{job_id}")
            if job["status"] in {"succeeded", "failed", "canceled"}:
                return dict(job)
            await asyncio.sleep(0.05)


async def test_a_v2_submit_past_its_own_budget_is_refused_and_nothing_is_sent(
    served: Served, emulator: Emulator
) -> None:
    over = budgeted(fanout(emulator.url, 2), {"paid_jobs": 1})
    status, _, body = await served.call("POST", JOBS, json=over)
    assert_error(status, body, 422, "invalid_workflow")
    assert body["error"]["details"]["type"] == "budget_exceeded"
    assert (
        "the prompt's extra_data.comfyfleet_budget.paid_jobs = 1"
        in (body["error"]["details"]["details"])
    )
    assert jobs_sent(emulator) == 0
    assert await queued(served) == 0


@pytest.mark.parametrize("budget", [{"paid_jobs": -1}, {"paid_jobs": "2"}, "two", {"cost": 1}])
async def test_a_bad_v2_budget_is_400_invalid_request(
    served: Served, emulator: Emulator, budget: Any
) -> None:
    status, _, body = await served.call(
        "POST", JOBS, json=budgeted(fanout(emulator.url, 1), budget)
    )
    assert_error(status, body, 400, "invalid_request")
    assert "extra_data.comfyfleet_budget" in body["error"]["message"]
    assert jobs_sent(emulator) == 0
    assert await queued(served) == 0


async def test_a_v2_submit_within_its_budget_runs(served: Served, emulator: Emulator) -> None:
    within = budgeted(fanout(emulator.url, 2), {"paid_jobs": 2, "spend": 1.0})
    status, _, body = await served.call("POST", JOBS, json=within)
    assert status == 201, body
    assert (await ended(served, body["id"]))["status"] == "succeeded"
    assert jobs_sent(emulator) == 2


async def test_a_v2_budget_is_kept_with_the_job_for_the_run_time_guard(
    served: Served, emulator: Emulator
) -> None:
    # One submit fed a list of three images: counted only as it runs, job by job.
    workflow = listed(emulator.url, 3, seed=5)
    workflow["c"]["inputs"]["failure_mode"] = "fail_fast"
    status, _, body = await served.call("POST", JOBS, json=budgeted(workflow, {"paid_jobs": 1}))
    assert status == 201, body
    assert (await ended(served, body["id"]))["status"] == "failed"
    assert jobs_sent(emulator) == 1  # the guard stopped the second and third
