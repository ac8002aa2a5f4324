"""The gateway SIGKILLed with a deep queue spread over its local lane and two backends."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.helpers import (
    assert_outputs_present,
    job_counts,
    output_files,
    save_sleep_prompt,
)
from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import poll

pytestmark = pytest.mark.faults

PROMPTS = 1000  # the figure; each prompt sleeps 10 ms, so the run stays short
SLEEP = 0.01


def test_gateway_sigkill_under_load_every_prompt_ends_exactly_once(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(dedicated=[(), ()], gateway_args=("--local-slots", "2"))
    prefixes = [f"gk{n:04d}" for n in range(PROMPTS)]
    with ThreadPoolExecutor(8) as pool:
        ids = list(
            pool.map(
                lambda p: fleet.submit(save_sleep_prompt(p[1], SLEEP, p[0])), enumerate(prefixes)
            )
        )
    assert len(set(ids)) == PROMPTS

    # Kill it while some prompts are done, some run (locally and on both backends) and
    # most are still pending.
    poll(lambda: job_counts(fleet.gateway)["completed"] >= 50, what="a first few completions")
    before = job_counts(fleet.gateway)
    assert before["pending"] > 0, before
    fleet.restart_gateway(kill=True)

    started = time.monotonic()

    def settled() -> bool:
        counts = job_counts(fleet.gateway)
        return counts["pending"] == 0 and counts["in_progress"] == 0

    poll(settled, what="every job to settle after the restart", timeout=90)
    counts = job_counts(fleet.gateway)
    assert counts["completed"] == PROMPTS, (counts, before, time.monotonic() - started)

    history = fleet.history()  # fails on a repeated key: one entry per prompt
    assert set(ids) <= set(history)
    assert {history[p]["status"]["status_str"] for p in ids} == {"success"}
    assert_outputs_present(fleet.gateway.data_dir, history, ids)
    files = output_files(fleet.gateway.data_dir)
    assert [p for p in prefixes if files[p] == 0] == []
    # A prompt the local lane was running at the kill may run again after the restart
    # (at-least-once execution, exactly-once completion): at most the two local slots.
    reran = {p: n for p, n in files.items() if n > 1}
    assert len(reran) <= 2 and all(n == 2 for n in reran.values()), reran
