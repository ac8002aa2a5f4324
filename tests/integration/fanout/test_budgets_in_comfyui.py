"""Budgets of prompts run on a real ComfyUI backend with the companion pack: the pack
reads the allowance the gateway sends with each prompt (ComfyUI's on-prompt handler),
refuses the job past it, and answers what the prompt spent (`GET /comfyfleet/paid/ID`),
which the gateway counts in place of the hold.

Needs COMFYUI_DIR and COMFY_VENV (as `make conformance` does); skipped without them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from comfyfleet.shares.policy import parse_policy
from tests.integration.fanout.conftest import KEY, KEY_ENV, start_emulator
from tests.integration.fanout.test_budgets import fanout, finished, jobs_sent, listed, statuses
from tests.integration.gateway.wire import poll, serve
from tests.real_comfyui import comfyui_with_pack, needs_comfyui

pytestmark = needs_comfyui


@pytest.mark.timeout(300)
async def test_a_comfyui_backend_keeps_prompts_within_their_allowances(tmp_path: Path) -> None:
    emulator = await start_emulator(latency=0.3)
    policy = parse_policy({"default": {"paid_jobs_per_day": 3}}, None)
    try:
        async with (
            comfyui_with_pack(tmp_path / "comfyui", {KEY_ENV: KEY}) as url,
            serve(
                tmp_path / "gateway",
                local_slots=0,
                backends=({"url": url, "name": "comfy"},),
                shares=policy,
            ) as served,
        ):

            async def backend_up() -> bool:
                listed_backends = await served.get("/api/fleet/backends")
                return [b["state"] for b in listed_backends["backends"]] == ["up"]

            await poll(backend_up, what="ComfyUI up behind the gateway", timeout=60)
            # 2 counted jobs, then a list of 2 whose count is known only as it runs.
            first = await served.submit(fanout(emulator.url, 2, mode="placeholder"))
            second = await served.submit(listed(emulator.url, 2, seed=40))
            entries = await asyncio.gather(finished(served, first), finished(served, second))
            slots = [slot for entry in entries for slot in statuses(entry)]
            refused = [slot for slot in slots if slot.get("error_class") == "BudgetExceeded"]
            assert jobs_sent(emulator) <= 3
            assert jobs_sent(emulator) + len(refused) == 4
            assert "comfyfleet_allowance" in refused[0]["error"]

            async def settled() -> bool:  # counted at what ComfyUI's pack says it sent
                dry = await served.post("/comfyfleet/cost", {"prompt": fanout(emulator.url, 1)})
                return bool(dry.json["budget"]["today"]["paid_jobs"] == jobs_sent(emulator))

            await poll(settled, what="both holds settled", timeout=30)
    finally:
        await emulator.server.close()
