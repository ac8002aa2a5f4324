"""Budgets of prompts run on a real ComfyUI backend with the companion pack: the pack
reads the allowance the gateway sends with each prompt (ComfyUI's on-prompt handler),
refuses the job past it, and answers what the prompt spent (`GET /comfyfleet/paid/ID`),
which the gateway counts in place of the hold.

Needs COMFYUI_DIR and COMFY_VENV (as `make conformance` does); skipped without them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.shares.policy import parse_policy
from tests.integration.fanout.conftest import KEY, KEY_ENV, start_emulator
from tests.integration.fanout.test_backend_budgets import side_by_side_within_three
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
            await side_by_side_within_three(served, emulator)
    finally:
        await emulator.server.close()
