"""Backends that die, hang, or fail a prompt: the job moves on, once, and ends once."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import websocket

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import (
    Fleet,
    backend_history,
    call,
    last_message,
    poll,
    sleep_prompt,
)
from tests.integration.gateway.processes import Frames


def run_on(fleet: Fleet, name: str, prompt: dict[str, Any], client_id: str | None = None) -> str:
    """Submit with every other backend drained, so `name` takes it; resume them after."""
    others = [other for other in fleet.backends if other != name]
    for other in others:
        assert call(fleet.gateway.url, "POST", f"/api/fleet/backends/{other}/drain")[0] == 200
    prompt_id = fleet.submit(prompt, client_id)
    assert fleet.wait_running_on_backend(prompt_id) == name
    for other in others:
        assert call(fleet.gateway.url, "POST", f"/api/fleet/backends/{other}/resume")[0] == 200
    return prompt_id


def assert_one_success_entry(fleet: Fleet, prompt_id: str) -> None:
    history = fleet.history()  # fails on a repeated key
    assert prompt_id in history
    assert history[prompt_id]["status"]["status_str"] == "success"
    assert last_message(history[prompt_id]) == "execution_success"


def test_backend_killed_mid_prompt_job_completes_elsewhere(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, dedicated=[()])
    prompt_id = run_on(fleet, "d0", sleep_prompt(1.5))
    time.sleep(0.2)  # well into the Sleep node
    fleet.backends["d0"].kill()

    fleet.wait_states({"d0": "down"}, timeout=5)
    job = fleet.wait_job(prompt_id, "completed", timeout=20)
    assert (job["attempt"], job["lane"]) == (2, "backend:s0")
    assert_one_success_entry(fleet, prompt_id)
    entry = backend_history(fleet.backends["s0"], prompt_id)
    assert entry is not None and entry["status"]["status_str"] == "success"

    # Started again on its port, the backend is picked up again without being asked.
    fleet.restart_backend("d0")
    fleet.wait_states({"d0": "up", "s0": "up"}, timeout=30)
    again = run_on(fleet, "d0", sleep_prompt(0.1, 1))
    assert fleet.wait_job(again, "completed")["lane"] == "backend:d0"


def test_hung_backend_job_is_requeued_and_backend_marked_suspect(make_fleet: MakeFleet) -> None:
    # d0 is a comfyfleet: it holds the prompt 3 s past the gateway's last word, and the
    # gateway moves it only once that has run out (a paused d0 never runs it too).
    fleet = make_fleet(
        shared=1, dedicated=[()], gateway_args=("--hang-timeout", "1.5", "--backend-hold", "3")
    )
    frames = Frames(fleet.gateway)
    try:
        prompt_id = run_on(fleet, "d0", sleep_prompt(3.0), frames.client_id)
        frames.progress(prompt_id)  # the gateway is receiving the prompt's frames
        fleet.stop("d0")
        stopped = time.monotonic()

        poll(lambda: fleet.lane_of(prompt_id) == "s0", what="the job to move to s0", timeout=10)
        moved_after = time.monotonic() - stopped
        assert 1.5 <= moved_after < 6.0, moved_after
        states = fleet.backend_states()
        assert states["d0"]["suspect"] is True
        assert states["s0"]["suspect"] is False

        job = fleet.wait_job(prompt_id, "completed", timeout=20)
        assert (job["attempt"], job["lane"]) == (2, "backend:s0")
        frames.done(prompt_id)
        assert_one_success_entry(fleet, prompt_id)
    finally:
        frames.close()
        fleet.resume("d0")
    assert fleet.backends["d0"].get("/prompt")  # it answers again


def test_a_comfyfleet_backend_resumed_mid_node_is_not_taken_for_hung(
    make_fleet: MakeFleet,
) -> None:
    """SIGSTOPped past the hang timeout in a node that sends no frame (`Work`: CPU time,
    which a stopped process does not get through), then resumed within its hold: the
    backend answers the keep it was sent meanwhile before the node's next frame. That
    answer made the gateway take it for hung (it answers, yet sends nothing): it
    interrupted the prompt there, and its retries on that backend found the id taken,
    so the job failed. The backend says how long it has run since it was stopped."""
    fleet = make_fleet(
        dedicated=[()], gateway_args=("--hang-timeout", "5", "--backend-hold", "18")
    )  # a keep every 5 s (the probe interval): one is sent while d0 is stopped
    try:
        prompt_id = fleet.submit(sleep_prompt(2.5, node="Work"))
        assert fleet.wait_running_on_backend(prompt_id) == "d0"
        time.sleep(0.3)
        fleet.stop("d0")
        time.sleep(7.0)  # past the hang timeout, within the hold
    finally:
        fleet.resume("d0")
    job = fleet.wait_job(prompt_id, "completed", timeout=30)
    assert (job["attempt"], job["lane"]) == (1, "backend:d0")
    assert fleet.backend_states()["d0"]["suspect"] is False
    assert_one_success_entry(fleet, prompt_id)


def test_a_requeued_job_is_not_replayed_as_running_to_a_reconnecting_client(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(dedicated=[()])
    client = Frames(fleet.gateway)
    prompt_id = fleet.submit(sleep_prompt(30.0), client.client_id)
    client.progress(prompt_id)  # running on d0, its node reported
    client.ws.close()
    fleet.backends["d0"].kill()
    assert fleet.wait_job(prompt_id, "pending", timeout=10)["status"] == "pending"

    again = Frames(fleet.gateway, client.client_id)
    again.until(lambda e: e["type"] == "status", "the greeting status")
    again.ws.settimeout(1.0)
    with contextlib.suppress(websocket.WebSocketTimeoutException):
        again.until(lambda e: False, "nothing more")
    replayed = [e for e in again.events if e["data"].get("prompt_id") == prompt_id]
    assert replayed == []  # back in the queue: nothing of it is current
    again.ws.close()
