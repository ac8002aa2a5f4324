"""A busy backend's next job, set aside ahead of time: it stays a pending job in every
view, never holds work back, yields to a job ahead of it, and survives a restart."""

from __future__ import annotations

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import (
    Fleet,
    backend_history,
    call,
    poll,
    unique_sleep_prompt,
)


def reserved(fleet: Fleet, name: str) -> list[str]:
    ids: list[str] = fleet.backend_states()[name]["reserved"]
    return ids


def wait_reserved(fleet: Fleet, name: str, prompt_id: str) -> None:
    poll(lambda: prompt_id in reserved(fleet, name), what=f"{prompt_id} reserved for {name}")


def started_at(fleet: Fleet, prompt_id: str) -> float:
    value: float = fleet.job(prompt_id)["execution_start_time"]
    return value


def ran_on(fleet: Fleet, prompt_id: str) -> list[str]:
    return [n for n, b in fleet.backends.items() if backend_history(b, prompt_id) is not None]


def one_backend_busy(fleet: Fleet) -> tuple[str, str, str]:
    """On a one-backend fleet: two 2 s prompts, then a short one. Returns their ids once
    the second runs and the short one is set aside as the backend's next."""
    first, second, third = (fleet.submit(unique_sleep_prompt(s)) for s in (2, 2, 0.2))
    fleet.wait_running_on_backend(second)
    wait_reserved(fleet, "s0", third)
    return first, second, third


def test_a_reserved_job_is_pending_everywhere_and_runs_next(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    first, second, third = one_backend_busy(fleet)

    job = fleet.job(third)
    assert (job["status"], job["lane"], job["attempt"]) == ("pending", None, 0)
    queue = fleet.gateway.get("/queue")
    assert [item[1] for item in queue["queue_running"]] == [second]
    assert [item[1] for item in queue["queue_pending"]] == [third]
    assert fleet.gateway.get("/prompt")["exec_info"]["queue_remaining"] == 2

    done = fleet.wait_job(third, "completed")
    assert (done["lane"], done["attempt"]) == ("backend:s0", 1)
    assert reserved(fleet, "s0") == []
    assert started_at(fleet, first) < started_at(fleet, second) < started_at(fleet, third)
    history = fleet.history()  # fails on a repeated key
    assert {history[p]["status"]["status_str"] for p in (first, second, third)} == {"success"}


def test_a_front_job_runs_before_a_reserved_one(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    _, second, third = one_backend_busy(fleet)

    status, body = call(
        fleet.gateway.url, "POST", "/prompt", {"prompt": unique_sleep_prompt(0.2), "front": True}
    )
    assert status == 200, body
    front = body["prompt_id"]
    poll(lambda: third not in reserved(fleet, "s0"), what="the reservation to be given back")

    for prompt_id in (front, third):
        fleet.wait_job(prompt_id, "completed")
    assert started_at(fleet, second) < started_at(fleet, front) < started_at(fleet, third)


def test_deleting_a_reserved_job_cancels_it(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    _, second, third = one_backend_busy(fleet)

    status, _ = call(fleet.gateway.url, "POST", "/queue", {"delete": [third]})
    assert status == 200
    assert fleet.job(third)["status"] == "cancelled"
    assert reserved(fleet, "s0") == []

    fleet.wait_job(second, "completed")
    after = fleet.submit(unique_sleep_prompt(0.1))
    fleet.wait_job(after, "completed")  # the backend went on with the next real job
    assert ran_on(fleet, third) == []
    assert fleet.job(third)["status"] == "cancelled"
    assert third not in fleet.history()


def test_no_job_waits_behind_a_long_prompt_while_a_backend_is_free(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=2)
    # Submitted at once: the long prompt's backend sets one of the short ones aside as
    # its next; the other backend, done with each short prompt soon, takes it over.
    long = fleet.submit(unique_sleep_prompt(6))
    short = [fleet.submit(unique_sleep_prompt(0.5)) for _ in range(6)]
    long_on = fleet.wait_running_on_backend(long)
    other = next(name for name in fleet.backends if name != long_on)
    poll(lambda: bool(reserved(fleet, long_on)), what=f"a job set aside for {long_on}")

    for prompt_id in short:
        fleet.wait_job(prompt_id, "completed")
    assert fleet.job(long)["status"] == "in_progress"
    assert {fleet.lane_of(p) for p in short} == {other}  # set aside or not
    assert all(ran_on(fleet, p) == [other] for p in short)
    fleet.wait_job(long, "completed")


def test_gateway_killed_with_reservations_runs_every_job_once(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    first, second, third = one_backend_busy(fleet)
    fourth = fleet.submit(unique_sleep_prompt(0.2))

    fleet.restart_gateway(kill=True)
    ids = [first, second, third, fourth]
    poll(
        lambda: all(fleet.job(p)["status"] == "completed" for p in ids),
        what="every job to complete",
        timeout=40,
    )
    history = fleet.history()  # fails on a repeated key
    assert {history[p]["status"]["status_str"] for p in ids} == {"success"}
    for prompt_id in ids:
        assert ran_on(fleet, prompt_id) == ["s0"], prompt_id
