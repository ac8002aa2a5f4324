"""Managed backends over their life: recycled without losing a prompt, warmed up before
work, stopped with the gateway however it ends, backed off when they cannot start."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.managed.spec import parse_group
from tests.integration.fleet.harness import poll, unique_sleep_prompt
from tests.integration.managed.conftest import MakeManaged
from tests.integration.managed.harness import INSTANCE, alive, managed, pids, port_block
from tests.servers import start_in_process


def test_recycled_after_max_prompts_when_idle_and_warmed_up_first(
    make_managed: MakeManaged, tmp_path: Path
) -> None:
    warmup = tmp_path / "warmup.json"
    warmup.write_text(json.dumps({"prompt": unique_sleep_prompt(0.2)}))
    fleet = make_managed(max_prompts=2, prefetch=1, warmup=str(warmup))
    (name,) = fleet.backends
    first_pid = managed(fleet, name)["pid"]

    ids = [fleet.submit(unique_sleep_prompt(0.6)) for _ in range(5)]
    for prompt_id in ids:
        job = fleet.wait_job(prompt_id, "completed")
        assert job["attempt"] == 1, job  # never interrupted, never run twice
    history = fleet.history()
    assert {history[p]["status"]["status_str"] for p in ids} == {"success"}

    # Two prompts per process: the third process runs the fifth.
    poll(lambda: managed(fleet, name)["recycles"] == 2, what="two recycles")
    info = managed(fleet, name)
    assert (info["restarts"], info["last_exit"]) == (0, "recycled after 2 prompts")
    assert info["pid"] != first_pid and not alive(first_pid)

    # Each process ran the warm-up before its first prompt (the instance keeps its
    # history across restarts: same data dir).
    entries = fleet.backends[name].get("/history")
    warmups = [
        e for e in entries.values() if e["prompt"][3]["client_id"].startswith("comfyfleet-warmup-")
    ]
    started = sorted(_start(e) for e in entries.values())
    assert len(warmups) == 3, len(warmups)
    assert started[0] == min(_start(e) for e in warmups)  # the very first thing it ran


def test_recycled_once_grown_past_max_rss_without_losing_a_prompt(
    make_managed: MakeManaged,
) -> None:
    fleet = make_managed(max_rss="1M")  # any process is past it once it has run a prompt
    (name,) = fleet.backends
    ids = [fleet.submit(unique_sleep_prompt(0.3)) for _ in range(2)]
    for prompt_id in ids:
        assert fleet.wait_job(prompt_id, "completed")["attempt"] == 1
    poll(lambda: managed(fleet, name)["recycles"] >= 1, what="a recycle")
    info = managed(fleet, name)
    assert info["last_exit"].startswith("recycled at") and info["last_exit"].endswith("resident")
    assert info["restarts"] == 0


def _start(entry: dict[str, Any]) -> int:
    stamps = {event: data.get("timestamp") for event, data in entry["status"]["messages"]}
    return int(stamps["execution_start"])


ONLY_THERE = """
class OnlyThere:
    CATEGORY = "test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1})}}

    def run(self, value):
        return {"ui": {"text": [str(value)]}, "result": (value,)}


NODE_CLASS_MAPPINGS = {"OnlyThere": OnlyThere}
"""
#: INSTANCE, answering 2 s after it starts.
SLOW = [
    "{python}",
    "-c",
    "import runpy, sys, time; time.sleep(2); sys.argv[0] = 'comfyfleet'; "
    "runpy.run_module('comfyfleet', run_name='__main__')",
    *INSTANCE[3:],
]


def test_a_restarted_gateway_queues_prompts_for_instances_not_answering_yet(
    make_managed: MakeManaged, tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "only_there.py").write_text(ONLY_THERE)  # a class the gateway lacks
    fleet = make_managed(command=[*SLOW, "--custom-nodes", str(nodes)])
    (name,) = fleet.backends
    known = Path(managed(fleet, name)["log"]).parent / "capabilities.json"
    poll(known.exists, what="what the instance offers, saved")

    fleet.restart_gateway(kill=False)  # its instance starts anew, and takes 2 s
    assert fleet.backend_states()[name]["state"] == "down"
    prompt = {"1": {"class_type": "OnlyThere", "inputs": {"value": 3}}}
    prompt_id = fleet.submit(prompt)  # known from last time: queued, not refused
    fleet.wait_job(prompt_id, "completed")
    assert fleet.history()[prompt_id]["outputs"] == {"1": {"text": ["3"]}}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_instance_outlives_the_gateway(make_managed: MakeManaged, sig: signal.Signals) -> None:
    fleet = make_managed(per_gpu=2)
    running = pids(fleet)
    assert len(running) == 2 and all(alive(pid) for pid in running.values())
    prompt_id = fleet.submit(unique_sleep_prompt(1.0))
    fleet.wait_running_on_backend(prompt_id)

    assert fleet.gateway.proc is not None
    fleet.gateway.proc.send_signal(sig)
    code = fleet.gateway.proc.wait(timeout=30)
    if sig == signal.SIGTERM:
        assert code == 0
        # Stopped before the gateway exits, once its running prompt had finished there.
        assert [pid for pid in running.values() if alive(pid)] == []
        with closing(sqlite3.connect(fleet.gateway.data_dir / "comfyfleet.db")) as db:
            query = "SELECT status, attempt FROM jobs WHERE prompt_id = ?"
            assert db.execute(query, (prompt_id,)).fetchone() == ("success", 1)
    else:
        poll(lambda: not any(alive(pid) for pid in running.values()), what="no orphans")


async def test_a_crash_loop_backs_off_and_is_reported(tmp_path: Path) -> None:
    exits = [sys.executable, "-c", "import sys; sys.exit(3)"]
    table = {"name": "bad", "gpus": "cpu", "command": exits, "port_range": port_block()}
    group = parse_group(table, tmp_path)
    server, _gateway = await start_in_process(tmp_path / "data", local_slots=0, comfyui=(group,))
    url = f"http://127.0.0.1:{server.port}/api/fleet/backends"
    try:
        async with aiohttp.ClientSession() as session:

            async def status() -> dict[str, Any]:
                async with session.get(url) as response:
                    (backend,) = (await response.json())["backends"]
                    assert backend["state"] == "down"
                    info: dict[str, Any] = backend["managed"]
                    return info

            started = time.monotonic()
            while (await status())["restarts"] < 3:
                assert time.monotonic() - started < 20, await status()
                await asyncio.sleep(0.05)
            # Three starts that failed at once, waits of 1 s and 2 s between them.
            assert time.monotonic() - started >= 2.5
            info = await status()
            assert info["last_exit"].startswith("exited with code 3 after")
            assert info["state"] == "backoff" and info["next_start"] > time.time() + 1
            await asyncio.sleep(1.0)
            assert (await status())["restarts"] == 3  # waiting out 4 s now, not retrying
    finally:
        await server.close()
