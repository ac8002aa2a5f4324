"""Prompts spread over four backends: one queue, every backend busy, one history entry each."""

from __future__ import annotations

import time

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import backend_history, sleep_prompt

PROMPTS = 8
SECONDS = 0.5


def test_prompts_spread_over_four_backends(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=4)
    started = time.monotonic()
    ids = [fleet.submit(sleep_prompt(SECONDS, color)) for color in range(PROMPTS)]
    for prompt_id in ids:
        fleet.wait_job(prompt_id, "completed")
    elapsed = time.monotonic() - started

    # One backend would need 8 x 0.5 = 4 s; four need 1 s plus dispatch overhead.
    assert elapsed < 0.6 * PROMPTS * SECONDS, elapsed

    lanes = {prompt_id: fleet.lane_of(prompt_id) for prompt_id in ids}
    assert set(lanes.values()) == set(fleet.backends), lanes
    for prompt_id, lane in lanes.items():
        assert lane is not None, prompt_id
        job = fleet.job(prompt_id)
        assert (job["attempt"], job["lane"]) == (1, f"backend:{lane}")
        # The backend the jobs API names ran it, and no other backend did.
        ran_it = {
            name
            for name, backend in fleet.backends.items()
            if backend_history(backend, prompt_id) is not None
        }
        assert ran_it == {lane}, (prompt_id, ran_it)
        entry = backend_history(fleet.backends[lane], prompt_id)
        assert entry is not None and entry["status"]["status_str"] == "success"

    history = fleet.history()  # fails on a repeated key
    mine = {p: e for p, e in history.items() if p in ids}
    assert set(mine) == set(ids)
    assert {e["status"]["status_str"] for e in mine.values()} == {"success"}
    for prompt_id in ids:
        images = mine[prompt_id]["outputs"]["3"]["images"]
        assert len(images) == 1 and images[0]["type"] == "temp"
