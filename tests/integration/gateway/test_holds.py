"""`POST /comfyfleet/holds`: what a gateway says, after this server restarted, of the
prompts it had sent here (HOLD_KEY): held prompts wait, released ones run, and a
request that is not a list of ids is a 400 in ComfyUI's shape."""

from __future__ import annotations

import asyncio
from pathlib import Path

from comfyfleet.domain.jobs import HOLD_KEY, HOLDS_FEATURE
from tests.integration.gateway.wire import save_prompt, serve, sleep_prompt


async def test_held_prompts_wait_until_released(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        pack = await served.request("GET", "/comfyfleet/pack")
        assert pack.json[HOLDS_FEATURE] is True
        sent = await served.request(
            "POST", "/prompt", {"prompt": save_prompt(1, "held"), "extra_data": {HOLD_KEY: True}}
        )
        first = sent.json["prompt_id"]
        await served.wait_history(first)  # sent in this process: it runs
    # Restarted with one such prompt queued (behind a long one): it waits for its gateway.
    async with serve(tmp_path, local_slots=1) as served:
        long = await served.request("POST", "/prompt", {"prompt": sleep_prompt(30.0)})
        sent = await served.request(
            "POST", "/prompt", {"prompt": save_prompt(2, "held"), "extra_data": {HOLD_KEY: True}}
        )
        queued = sent.json["prompt_id"]
        long_id = long.json["prompt_id"]
    async with serve(tmp_path, local_slots=1) as served:
        assert served.gateway.scheduler.state.held == {queued}
        await served.request("POST", f"/api/jobs/{long_id}/cancel")  # not held: it ran
        for _ in range(200):
            if (await served.job(long_id))["status"] == "cancelled":
                break
            await asyncio.sleep(0.05)
        queue = (await served.request("GET", "/queue")).json
        assert [item[1] for item in queue["queue_pending"]] == [queued]
        assert queue["queue_running"] == []
        for bad in ({"release": "x"}, {"release": [1]}, [], {"release": ["a"] * 10_001}):
            refused = await served.request("POST", "/comfyfleet/holds", bad)
            assert refused.status == 400 and refused.json["error"]["type"] == "invalid_request"
        released = await served.request("POST", "/comfyfleet/holds", {"release": [queued, "x"]})
        assert released.json == {"released": [queued]}
        await served.wait_history(queued)
