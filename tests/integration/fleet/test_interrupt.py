"""/interrupt and job cancel reach the backend that runs the prompt."""

from __future__ import annotations

import time

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import backend_history, call, last_message, poll, sleep_prompt


def test_interrupt_and_cancel_reach_the_backend(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    backend = fleet.backends["s0"]

    interrupted = fleet.submit(sleep_prompt(5.0))
    assert fleet.wait_running_on_backend(interrupted) == "s0"
    asked = time.monotonic()
    assert call(fleet.gateway.url, "POST", "/interrupt", {"prompt_id": interrupted})[0] == 200
    fleet.wait_job(interrupted, "interrupted", "completed", "failed", timeout=10)
    assert time.monotonic() - asked < 1.5
    assert fleet.job(interrupted)["status"] == "interrupted"
    entry = fleet.history()[interrupted]
    assert last_message(entry) == "execution_interrupted"
    there = backend_history(backend, interrupted)
    assert there is not None and last_message(there) == "execution_interrupted"

    cancelled = fleet.submit(sleep_prompt(5.0, 1))
    assert fleet.wait_running_on_backend(cancelled) == "s0"
    asked = time.monotonic()
    status, body = call(fleet.gateway.url, "POST", f"/api/jobs/{cancelled}/cancel")
    assert (status, body) == (200, {"cancelled": [cancelled]})
    fleet.wait_job(cancelled, "cancelled", "interrupted", "completed", "failed", timeout=10)
    assert time.monotonic() - asked < 1.5
    job = fleet.job(cancelled)
    assert (job["status"], job["attempt"]) == ("cancelled", 1)
    poll(lambda: backend_history(backend, cancelled) is not None, what="the backend's entry")
    there = backend_history(backend, cancelled)
    assert there is not None and last_message(there) == "execution_interrupted"
    assert backend.get("/prompt")["exec_info"]["queue_remaining"] == 0
