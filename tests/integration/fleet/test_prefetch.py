"""Prefetch: prompts queued on a backend ahead of time, still cancellable there."""

from __future__ import annotations

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import (
    Fleet,
    backend_history,
    backend_queue,
    call,
    poll,
    unique_sleep_prompt,
)


def one_queued_behind(make_fleet: MakeFleet) -> tuple[Fleet, str, str]:
    """One backend with prefetch 1: a 3 s prompt running, another queued there."""
    fleet = make_fleet(shared=1, backend_fields={"prefetch": 1})
    backend = fleet.backends["s0"]
    first = fleet.submit(unique_sleep_prompt(3))
    queued = fleet.submit(unique_sleep_prompt(3))
    poll(lambda: queued in backend_queue(backend)[1], what="the second prompt queued there")
    return fleet, first, queued


def test_a_prompt_queued_on_a_backend_can_be_cancelled(make_fleet: MakeFleet) -> None:
    fleet, first, queued = one_queued_behind(make_fleet)
    backend = fleet.backends["s0"]

    status, _ = call(fleet.gateway.url, "POST", f"/api/jobs/{queued}/cancel")
    assert status == 200
    job = fleet.wait_job(queued, "cancelled", timeout=5)
    assert job["status"] == "cancelled"
    assert queued not in backend_queue(backend)[1]
    fleet.wait_job(first, "completed")
    assert backend_history(backend, queued) is None


def test_interrupting_a_prompt_queued_on_a_backend_ends_it_there(make_fleet: MakeFleet) -> None:
    fleet, first, queued = one_queued_behind(make_fleet)
    backend = fleet.backends["s0"]

    status, _ = call(fleet.gateway.url, "POST", "/interrupt", {"prompt_id": queued})
    assert status == 200
    fleet.wait_job(queued, "interrupted", timeout=5)
    assert fleet.job(first)["status"] == "in_progress"  # only the one named
    entry = fleet.history()[queued]
    assert entry["status"]["status_str"] == "error"
    assert [m[0] for m in entry["status"]["messages"]] == ["execution_interrupted"]
    assert fleet.wait_job(first, "completed")["lane"] == "backend:s0"
    assert backend_history(backend, queued) is None


def one_long_running(make_fleet: MakeFleet, seconds: float) -> tuple[Fleet, str, str, str]:
    """Two backends with prefetch 1, a long prompt running on one: (fleet, the prompt,
    its backend, the other backend)."""
    fleet = make_fleet(shared=2, backend_fields={"prefetch": 1})
    long = fleet.submit(unique_sleep_prompt(seconds))
    long_on = fleet.wait_running_on_backend(long)
    other = next(name for name in fleet.backends if name != long_on)
    return fleet, long, long_on, other


def test_a_free_backend_takes_back_a_prompt_queued_behind_a_long_one(
    make_fleet: MakeFleet,
) -> None:
    fleet, long, long_on, other = one_long_running(make_fleet, 6)
    # One short prompt queued behind the long one, the others run on the other backend.
    short = [fleet.submit(unique_sleep_prompt(0.5)) for _ in range(3)]

    def queued_behind() -> list[str]:
        return [p for p in short if p in backend_queue(fleet.backends[long_on])[1]]

    poll(lambda: bool(queued_behind()), what=f"a prompt queued on {long_on} behind the long one")
    behind = queued_behind()

    for prompt_id in short:
        fleet.wait_job(prompt_id, "completed", timeout=10)
    assert fleet.job(long)["status"] == "in_progress"  # done before the long one ends
    for prompt_id in short:
        assert fleet.lane_of(prompt_id) == other
        assert backend_history(fleet.backends[long_on], prompt_id) is None
    assert {fleet.job(p)["attempt"] for p in behind} == {2}  # taken back once
    history = fleet.history()  # fails on a repeated key
    assert {history[p]["status"]["status_str"] for p in short} == {"success"}
    fleet.wait_job(long, "completed")


def test_an_idle_backend_gets_the_next_prompt_before_a_prefetch_slot(
    make_fleet: MakeFleet,
) -> None:
    fleet, long, _, other = one_long_running(make_fleet, 3)
    # The long prompt's backend still has a (prefetch) slot free, and it is the warmer
    # one for this graph; the idle backend starts the prompt at once instead.
    short = fleet.submit(unique_sleep_prompt(0.3))
    job = fleet.wait_job(short, "completed", timeout=2.5)
    assert (job["lane"], job["attempt"]) == (f"backend:{other}", 1)  # not taken back
    assert fleet.job(long)["status"] == "in_progress"
    fleet.wait_job(long, "completed")
