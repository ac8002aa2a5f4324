"""Backends killed, hung and wiped under load: jobs move, complete, and end once."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from comfyfleet.testing import LEDGER_ENV
from tests.faults.helpers import (
    assert_outputs_present,
    job_counts,
    output_files,
    save_sleep_prompt,
)
from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import Fleet, backend_history, backend_queue, poll

pytestmark = pytest.mark.faults

PROMPTS = 40
SLEEP = 0.15


def submit_many(fleet: Fleet, tag: str, count: int = PROMPTS) -> dict[str, str]:
    """prompt_id -> its SaveImage prefix."""
    prefixes = [f"{tag}{n:03d}" for n in range(count)]
    with ThreadPoolExecutor(4) as pool:
        ids = pool.map(lambda p: fleet.submit(save_sleep_prompt(p, SLEEP)), prefixes)
        return dict(zip(ids, prefixes, strict=True))


def runs_anything(fleet: Fleet, name: str) -> bool:
    """Whether the gateway has a prompt running on backend `name`."""
    lanes = fleet.gateway.get("/api/fleet/backends")["backends"]
    return any(lane["running"] for lane in lanes if lane["name"] == name)


def running_on(fleet: Fleet, name: str) -> bool:
    return bool(backend_queue(fleet.backends[name])[0])


def settle_and_check(fleet: Fleet, jobs: dict[str, str], timeout: float = 60) -> None:
    """Every job completed exactly once at the gateway, with exactly one output file."""

    def settled() -> bool:
        # Each job asked by itself: counts read one status at a time can miss a job
        # that moves back from running to pending (given up on a hung backend) between
        # two reads.
        if any(fleet.job(p)["status"] in ("pending", "in_progress") for p in jobs):
            return False
        counts = job_counts(fleet.gateway)
        return counts["pending"] == 0 and counts["in_progress"] == 0

    poll(settled, what="every job to settle", timeout=timeout)
    ended = {p: fleet.job(p) for p in jobs}
    assert {job["status"] for job in ended.values()} == {"completed"}, [
        job for job in ended.values() if job["status"] != "completed"
    ]
    history = fleet.history()  # fails on a repeated key
    assert set(jobs) <= set(history)
    assert {history[p]["status"]["status_str"] for p in jobs} == {"success"}
    assert_outputs_present(fleet.gateway.data_dir, history, jobs)
    files = output_files(fleet.gateway.data_dir)
    wrong = {prefix: files[prefix] for prefix in jobs.values() if files[prefix] != 1}
    assert wrong == {}, wrong  # copied back once, from the attempt that counted


def test_backend_sigkill_mid_prompt_then_back_with_empty_history(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(dedicated=[(), ()])
    first = submit_many(fleet, "bk")
    poll(lambda: running_on(fleet, "d0"), what="d0 to run a prompt")
    fleet.backends["d0"].kill()  # SIGKILL in the middle of a Sleep
    fleet.wait_states({"d0": "down"}, timeout=10)

    # Back on the same port with nothing: no history, no outputs, no queue.
    shutil.rmtree(fleet.backends["d0"].data_dir)
    fleet.restart_backend("d0")
    fleet.wait_states({"d0": "up"}, timeout=30)
    # Back within the time its prompt was held there, d0 is asked for it (at the next
    # look, within a second) before its slot is free again.
    poll(lambda: not runs_anything(fleet, "d0"), what="d0 to give up its lost prompt")
    second = submit_many(fleet, "be", 20)
    settle_and_check(fleet, {**first, **second})
    retried = [p for p in first if fleet.job(p)["attempt"] > 1]
    assert retried, "no job was moved off the killed backend"
    lanes = {fleet.lane_of(p) for p in second}
    assert "d0" in lanes, lanes  # the wiped backend took work again


def test_backend_restarted_empty_while_gateway_waits_on_it(make_fleet: MakeFleet) -> None:
    """Killed and back with an empty history before the gateway notices it was gone."""
    fleet = make_fleet(dedicated=[(), ()])
    jobs = submit_many(fleet, "bw")
    poll(lambda: running_on(fleet, "d1"), what="d1 to run a prompt")
    fleet.backends["d1"].kill()
    shutil.rmtree(fleet.backends["d1"].data_dir)
    fleet.restart_backend("d1")
    settle_and_check(fleet, jobs)


def test_backend_hang_sigstop_jobs_move_and_end_once(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(
        dedicated=[(), ()], gateway_args=("--hang-timeout", "1.0", "--backend-hold", "3")
    )
    try:
        jobs = submit_many(fleet, "bh")
        poll(lambda: running_on(fleet, "d0"), what="d0 to run a prompt")
        held_there = set().union(*backend_queue(fleet.backends["d0"]))
        fleet.stop("d0")  # SIGSTOP: the connection stays open, nothing answers
        poll(
            lambda: bool(fleet.backend_states()["d0"]["suspect"]),
            what="d0 to be marked suspect",
            timeout=10,
        )
        settle_and_check(fleet, jobs)
        assert {fleet.lane_of(p) for p in jobs} >= {"d1"}
    finally:
        if fleet.backends["d0"] in fleet.stopped:
            fleet.resume("d0")
    # Resumed past its hold, the backend gives back what the gateway moved, and runs none
    # of it to its end; the gateway still has one entry each.
    fleet.wait_states({"d0": "up"}, timeout=30)
    poll(lambda: not running_on(fleet, "d0"), what="d0 to go idle", timeout=30)
    settle_and_check(fleet, jobs)
    moved = [p for p in held_there if fleet.lane_of(p) != "d0"]
    assert moved, "the gateway moved nothing off the stopped backend"
    ghosts = [p for p in moved if backend_history(fleet.backends["d0"], p) is not None]
    assert ghosts == [], ghosts


def test_a_comfyfleet_backend_restarted_runs_nothing_its_gateway_moved(
    make_fleet: MakeFleet,
) -> None:
    """A comfyfleet backend SIGKILLed and started again on its data ran its own durable
    queue about a second later, prompts the gateway had moved elsewhere included: a
    ghost run of each (its outputs written, its history a success there)."""
    fleet = make_fleet(dedicated=[(), ()], backend_fields={"prefetch": 2})
    jobs = {fleet.submit(save_sleep_prompt(f"gh{n:02d}", 1.0, n)): f"gh{n:02d}" for n in range(8)}
    poll(lambda: running_on(fleet, "d0"), what="d0 to run a prompt")
    held_there = set().union(*backend_queue(fleet.backends["d0"]))
    fleet.backends["d0"].kill()
    fleet.wait_states({"d0": "down"}, timeout=10)
    # Its port refuses: the gateway moves its prompts at once (started again sooner, it
    # would find them held there and follow them).
    poll(
        lambda: any(fleet.lane_of(p) != "d0" for p in held_there),
        what="the gateway to move a prompt off the killed backend",
    )
    fleet.restart_backend("d0")  # its queue as it was: running and prefetched prompts
    settle_and_check(fleet, jobs)
    moved = [p for p in held_there if fleet.lane_of(p) != "d0"]
    assert moved, "the gateway moved nothing off the killed backend"
    fleet.wait_states({"d0": "up"}, timeout=30)
    time.sleep(2.0)  # what d0 would have run of its own queue by now
    ghosts = [p for p in moved if backend_history(fleet.backends["d0"], p) is not None]
    assert ghosts == [], ghosts
    assert set().union(*backend_queue(fleet.backends["d0"])) == set()


def test_a_comfyfleet_backend_paused_within_its_hold_ends_its_prompt_once(
    make_fleet: MakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A comfyfleet backend SIGSTOPped past the hang timeout but within its hold: the
    gateway sent it an interrupt at once, which it read when it went on, just after the
    prompt's side effect; the prompt ended interrupted, which no client asked for
    (chaos seeds 1001-1003). Silent (no keep answered either), it is paused or cut off,
    not hung: its hold stops the prompt there in time, so the gateway waits for it."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    fleet = make_fleet(
        dedicated=[()], gateway_args=("--hang-timeout", "1.0", "--backend-hold", "20")
    )
    prompt = {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": "paused", "seconds": 1.5}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "p"}},
    }
    prompt_id = fleet.submit(prompt)
    poll(lambda: running_on(fleet, "d0"), what="d0 to run the prompt")
    fleet.stop("d0")
    try:
        time.sleep(3.0)  # past the hang timeout, within the hold
    finally:
        fleet.resume("d0")
    settle_and_check(fleet, {prompt_id: "p"})
    assert fleet.lane_of(prompt_id) == "d0"
    assert fleet.job(prompt_id)["attempt"] == 1
    lines = [line for line in ledger.read_text().splitlines() if prompt_id in line]
    assert len(lines) == 1, lines
