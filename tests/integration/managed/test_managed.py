"""Managed backends: four come up and take work, and each keeps going when its process
is killed or stops answering; drain, resume and remove work on them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.integration.fleet.harness import Fleet, call, poll, unique_sleep_prompt
from tests.integration.managed.harness import alive, kill_leftovers, managed, pids, start_managed


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Four instances on the CPU; one silent for 3 s is restarted."""
    root = tmp_path_factory.mktemp("four")
    fleet = start_managed(root / "gateway", per_gpu=4, health_timeout=3)
    try:
        yield fleet
    finally:
        fleet.close()
        kill_leftovers(root)


def test_four_instances_come_up_and_take_work(four: Fleet) -> None:
    states = four.backend_states()
    assert sorted(states) == ["m-cpu-0", "m-cpu-1", "m-cpu-2", "m-cpu-3"]
    for state in states.values():
        info = state["managed"]
        assert (info["state"], info["gpu"]) == ("running", "cpu")
        assert alive(info["pid"]) and state["url"].endswith(f":{info['port']}")
        assert state["validates"]  # a comfyfleet serves the companion pack's routes
        assert os.path.getsize(info["log"]) > 0  # its output goes to its own log
    assert len(set(pids(four).values())) == 4

    ids = [four.submit(unique_sleep_prompt(1.5)) for _ in range(4)]
    for prompt_id in ids:
        assert four.wait_job(prompt_id, "completed")["attempt"] == 1
    assert {four.lane_of(p) for p in ids} == set(states)  # one on each, at once


def test_an_instance_killed_mid_prompt_comes_back_and_its_prompt_finishes_elsewhere(
    four: Fleet,
) -> None:
    prompt_id = four.submit(unique_sleep_prompt(3))
    name = four.wait_running_on_backend(prompt_id)
    before = managed(four, name)
    os.kill(before["pid"], signal.SIGKILL)

    job = four.wait_job(prompt_id, "completed")
    assert job["attempt"] == 2 and four.lane_of(prompt_id) != name

    # Back within its first backoff (1 s) plus a start.
    poll(lambda: managed(four, name)["state"] == "running", what=f"{name} back", timeout=20)
    after = managed(four, name)
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_exit"].startswith("killed by SIGKILL after")
    assert after["pid"] != before["pid"] and alive(after["pid"])
    four.wait_all_up()
    assert not alive(before["pid"])


def test_an_instance_that_stops_answering_is_restarted(four: Fleet) -> None:
    name = "m-cpu-1"
    before = managed(four, name)
    os.kill(before["pid"], signal.SIGSTOP)  # alive, silent
    try:
        poll(
            lambda: managed(four, name)["restarts"] == before["restarts"] + 1,
            what=f"{name} restarted",
            timeout=20,
        )
    finally:
        if alive(before["pid"]):
            os.kill(before["pid"], signal.SIGCONT)
    assert managed(four, name)["last_exit"].startswith("stopped answering for")
    poll(lambda: not alive(before["pid"]), what="the silent process gone", timeout=10)
    poll(lambda: managed(four, name)["state"] == "running", what=f"{name} back", timeout=20)
    four.wait_all_up()


def test_drain_resume_and_remove_work_on_managed_instances(four: Fleet) -> None:
    url = four.gateway.url
    status, body = call(url, "POST", "/api/fleet/backends/m-cpu-0/drain")
    assert (status, body["state"], body["managed"]["state"]) == (200, "draining", "running")
    ids = [four.submit(unique_sleep_prompt(0.5)) for _ in range(6)]
    for prompt_id in ids:
        four.wait_job(prompt_id, "completed")
    assert "m-cpu-0" not in {four.lane_of(p) for p in ids}
    status, body = call(url, "POST", "/api/fleet/backends/m-cpu-0/resume")
    assert (status, body["state"]) == (200, "up")

    pid = managed(four, "m-cpu-3")["pid"]
    status, body = call(url, "DELETE", "/api/fleet/backends/m-cpu-3?timeout=5")
    assert (status, body) == (200, {"removed": "m-cpu-3"})
    assert "m-cpu-3" not in four.backend_states()
    assert not alive(pid)  # stopped with its backend, not left running
