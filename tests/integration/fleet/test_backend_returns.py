"""A backend comes back holding prompts the gateway gave up on there, or the gateway comes
back to prompts that ended without it: nothing runs twice, nothing is failed for it, and
the client gets the frames it would have had."""

from __future__ import annotations

import time

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import (
    backend_history,
    backend_queue,
    last_message,
    poll,
    unique_sleep_prompt,
)
from tests.integration.fleet.test_backend_failures import run_on
from tests.integration.fleet.test_prompt_streams import assert_one_stream, stream_of
from tests.integration.gateway.processes import Frames


def test_a_backend_back_with_the_prompt_is_followed_not_failed(make_fleet: MakeFleet) -> None:
    """A backend that keeps its queue across a crash (another comfyfleet) runs the prompt
    again when it restarts, under the same id: the gateway follows it there."""
    fleet = make_fleet(dedicated=[()])
    frames = Frames(fleet.gateway)
    try:
        prompt_id = fleet.submit(unique_sleep_prompt(2.0), frames.client_id)
        frames.progress(prompt_id)
        fleet.backends["d0"].kill()
        fleet.wait_job(prompt_id, "pending", timeout=10)
        fleet.restart_backend("d0")
        job = fleet.wait_job(prompt_id, "completed", "failed", timeout=30)
        assert_one_stream(stream_of(frames, prompt_id), "execution_success")
    finally:
        frames.close()
    assert job["status"] == "completed", job
    entry = fleet.history()[prompt_id]
    assert entry["status"]["status_str"] == "success"
    assert entry["outputs"]["3"]["images"], entry
    there = backend_history(fleet.backends["d0"], prompt_id)
    assert there is not None and last_message(there) == "execution_success"


def test_a_backend_back_with_a_prompt_run_elsewhere_drops_it(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, dedicated=[()])
    # Long enough that d0 is back and reconnected well before its own copy could end.
    prompt_id = run_on(fleet, "d0", unique_sleep_prompt(12.0))
    fleet.backends["d0"].kill()
    poll(lambda: fleet.lane_of(prompt_id) == "s0", what="the job to move to s0", timeout=10)
    fleet.restart_backend("d0")  # it takes up its own copy of the prompt again
    fleet.wait_states({"d0": "up"}, timeout=30)

    returned = fleet.backends["d0"]
    poll(lambda: backend_queue(returned) == ([], []), what="d0 to drop its copy", timeout=10)
    job = fleet.wait_job(prompt_id, "completed", timeout=30)
    assert (job["lane"], job["attempt"]) == ("backend:s0", 2)
    time.sleep(0.5)
    there = backend_history(returned, prompt_id)
    assert there is None or last_message(there) != "execution_success", there


def test_a_prompt_that_ended_while_the_gateway_was_down_reaches_its_client(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(dedicated=[()])
    frames = Frames(fleet.gateway)
    prompt_id = fleet.submit(unique_sleep_prompt(1.0), frames.client_id)
    frames.progress(prompt_id)
    frames.close()
    fleet.gateway.kill()
    backend = fleet.backends["d0"]
    poll(lambda: backend_history(backend, prompt_id) is not None, what="the end on d0")

    fleet.stop("d0")  # the client is back before the gateway can ask d0
    fleet.restart_gateway(kill=False)
    again = Frames(fleet.gateway, frames.client_id)
    fleet.resume("d0")
    try:
        types = stream_of(again, prompt_id)
    finally:
        again.close()
    assert_one_stream(types, "execution_success")
    [executed] = [e for e in again.events if e["type"] == "executed"]
    assert executed["data"]["node"] == "3"
    assert executed["data"]["output"] == fleet.history()[prompt_id]["outputs"]["3"]
