"""Held prompts (`extra_data.comfyfleet_hold`, sent by a gateway to this server as its
backend): they run only while the gateway keeps them (`POST /comfyfleet/holds`), wait
after a restart until it does, and a request that is not a list of ids with a number
of seconds is a 400 in ComfyUI's shape."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from comfyfleet.domain.jobs import HOLD_KEY, HOLDS_FEATURE
from tests.integration.gateway.wire import Served, save_prompt, serve, sleep_prompt


async def status_of(served: Served, prompt_id: str, *wanted: str) -> str:
    for _ in range(400):
        status = str((await served.job(prompt_id))["status"])
        if status in wanted:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"{prompt_id} never reached {wanted}")


async def held(served: Served, prompt: dict[str, Any], seconds: float) -> str:
    body = {"prompt": prompt, "extra_data": {HOLD_KEY: seconds}}
    return str((await served.request("POST", "/prompt", body)).json["prompt_id"])


async def test_held_prompts_wait_after_a_restart_until_kept(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        pack = await served.request("GET", "/comfyfleet/pack")
        assert pack.json[HOLDS_FEATURE] is True
        await served.wait_history(await held(served, save_prompt(1, "held"), 30))  # it runs
        # One queued behind a long prompt when the server stops.
        long = (await served.request("POST", "/prompt", {"prompt": sleep_prompt(30.0)})).json
        queued = await held(served, save_prompt(2, "held"), 30)
    async with serve(tmp_path, local_slots=1) as served:
        await served.request("POST", f"/api/jobs/{long['prompt_id']}/cancel")  # not held: ran
        await status_of(served, long["prompt_id"], "cancelled")
        await asyncio.sleep(0.5)
        queue = (await served.request("GET", "/queue")).json
        assert [item[1] for item in queue["queue_pending"]] == [queued]
        assert queue["queue_running"] == []
        bad: Any
        for bad in (
            {"keep": "x", "seconds": 5},
            {"keep": [1], "seconds": 5},
            {"keep": [queued]},
            {"keep": [queued], "seconds": True},
            {"keep": [queued], "seconds": 0},
            {"keep": [queued], "seconds": 1e9},
            [],
            {"keep": ["a"] * 10_001, "seconds": 5},
        ):
            refused = await served.request("POST", "/comfyfleet/holds", bad)
            assert refused.status == 400 and refused.json["error"]["type"] == "invalid_request"
        kept = await served.request(
            "POST", "/comfyfleet/holds", {"keep": [queued, "x"], "seconds": 30}
        )
        assert kept.json["kept"] == [queued]
        assert 0 <= kept.json["awake"] < 60  # how long this process has run without a stop
        await served.wait_history(queued)


async def test_a_held_prompt_no_one_keeps_is_given_back_and_runs_again_once_kept(
    tmp_path: Path,
) -> None:
    """A paused gateway (or one cut off) keeps nothing: what it sent stops here."""
    async with serve(tmp_path, local_slots=1) as served:
        prompt_id = await held(served, sleep_prompt(3.0), 1.0)
        await status_of(served, prompt_id, "in_progress")
        await status_of(served, prompt_id, "pending")  # given back once its hold ran out
        await asyncio.sleep(1.0)
        assert (await served.job(prompt_id))["status"] == "pending"  # and it waits
        await served.request("POST", "/comfyfleet/holds", {"keep": [prompt_id], "seconds": 30})
        entry = await served.wait_history(prompt_id)
        assert entry["status"]["status_str"] == "success"
        assert (await served.job(prompt_id))["attempt"] == 2


async def test_a_released_prompt_is_given_back_at_once_and_waits_for_a_keep(
    tmp_path: Path,
) -> None:
    """A worker whose gateway connection broke lets go of what its backend holds: a
    running prompt goes back to the queue now, not when its hold runs out."""
    async with serve(tmp_path, local_slots=1) as served:
        prompt_id = await held(served, sleep_prompt(5.0), 60.0)
        await status_of(served, prompt_id, "in_progress")
        for bad in ({"release": "x"}, {"release": [1]}, {"release": ["a"] * 10_001}):
            refused = await served.request("POST", "/comfyfleet/holds", bad)
            assert refused.status == 400 and refused.json["error"]["type"] == "invalid_request"
        started = asyncio.get_running_loop().time()
        released = await served.request(
            "POST", "/comfyfleet/holds", {"release": [prompt_id, "not-held"]}
        )
        assert released.json == {"released": [prompt_id]}
        await status_of(served, prompt_id, "pending")
        assert asyncio.get_running_loop().time() - started < 2.0  # not its 60 s hold
        await asyncio.sleep(1.0)
        assert (await served.job(prompt_id))["status"] == "pending"  # and it waits
        await served.request("POST", "/comfyfleet/holds", {"keep": [prompt_id], "seconds": 30})
        entry = await served.wait_history(prompt_id)
        assert entry["status"]["status_str"] == "success"
