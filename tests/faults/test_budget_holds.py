"""A gateway SIGKILLed while a prompt it granted an allowance runs on a backend: after the
restart it follows the prompt to its end and settles the hold at what the backend sent,
so the tenant's budget counts what was paid for, not what was held. Processes: the
gateway and a comfyfleet backend (`comfyfleet serve`); the provider emulator in the test."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, KEY_ENV, start_emulator
from tests.integration.fanout.test_budgets import fanout, jobs_sent, listed
from tests.servers import ServerProcess

pytestmark = pytest.mark.faults

DAY_JOBS = 3


async def until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(check):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


def status_of(gateway: ServerProcess, prompt_id: str) -> str | None:
    entry = gateway.get(f"/history/{prompt_id}").get(prompt_id)
    return None if entry is None else str(entry["status"]["status_str"])


def today(gateway: ServerProcess, url: str) -> int:
    answer = gateway.post("/comfyfleet/cost", {"prompt": fanout(url, 1, seed=99)})
    return int(answer["budget"]["today"]["paid_jobs"])


def submit(gateway: ServerProcess, prompt: dict[str, Any]) -> tuple[int, Any]:
    try:
        return 200, gateway.post("/prompt", {"prompt": prompt})
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


async def test_a_gateway_killed_mid_prompt_settles_its_hold_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)  # the backend's key vault reads its environment
    emulator: Emulator = await start_emulator(latency=1.5)
    backend = ServerProcess(tmp_path / "backend", "--local-slots", "2")
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"local_slots = 0\n\n[tenants.default]\npaid_jobs_per_day = {DAY_JOBS}\n\n"
        f'[[backends]]\nname = "gpu"\nurl = "{backend.url}"\n',
        encoding="utf-8",
    )
    gateway = ServerProcess(tmp_path / "gateway", "--config", str(config))
    try:
        await asyncio.to_thread(backend.start)
        await asyncio.to_thread(gateway.start)
        await until(
            lambda: [b["state"] for b in gateway.get("/api/fleet/backends")["backends"]] == ["up"],
            "the backend up",
        )
        # Its count is known only as it runs: its allowance is all the day has (3).
        _, queued = await asyncio.to_thread(submit, gateway, listed(emulator.url, 2, seed=1))
        prompt_id = queued["prompt_id"]
        await until(lambda: jobs_sent(emulator) >= 1, "a job at the provider")
        assert await asyncio.to_thread(today, gateway, emulator.url) == DAY_JOBS  # held

        await asyncio.to_thread(gateway.kill)
        await asyncio.to_thread(gateway.start)
        await until(lambda: status_of(gateway, prompt_id) is not None, "the prompt's end", 90)
        assert status_of(gateway, prompt_id) == "success"
        sent = jobs_sent(emulator)
        assert sent == 2  # each item's job once: the restart paid for nothing twice
        await until(lambda: today(gateway, emulator.url) == sent, "the hold settled at 2")

        # What the hold did not spend is free again; past it, a submit is refused.
        status, _ = await asyncio.to_thread(submit, gateway, fanout(emulator.url, 1, seed=5))
        assert status == 200
        status, refused = await asyncio.to_thread(submit, gateway, fanout(emulator.url, 2, seed=7))
        assert status == 400 and refused["error"]["type"] == "budget_exceeded"
    finally:
        gateway.kill()
        backend.kill()
        await emulator.server.close()
