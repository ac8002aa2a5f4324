"""The fleet inside one graph: a parent fanned out over four backends.

Four backends are `comfyfleet serve --local-slots 1 --testing-nodes` processes (one
prompt at a time, like ComfyUI); the gateway runs `--local-slots 1` (where parents
wait) with the four as backends. The parent is EmptyImage -> Sleep(1 s) -> Run on the
Fleet (count 8, varying the colour) -> Collect from the Fleet -> PreviewImage. Figures:

- batch_8x1s: from the parent's submit to its done signal (`executing` null on its
  client's WebSocket), median of `--repeat` runs. Baseline, same run: the same eight
  prompts one after another on one backend through the same gateway (serial).
- cancel_children: from `POST /api/jobs/PARENT/cancel` with four children running
  (30 s each) and four queued until every child is cancelled, as the jobs API shows.

With `--backends URL,...` (four servers already running, e.g. real ComfyUI instances
with ComfyUI's testing node pack, and `--sleep-node TestSleep`) the children run there.

    .venv/bin/python bench/bench_fleet_children.py [--repeat 3] [--backends URL,...]
        [--sleep-node Sleep]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, serve, wait_ready

BACKENDS, CHILDREN, SECONDS = 4, 8, 1.0


SLEEP = {"node": "Sleep"}


def parent(count: int, seconds: float, color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": SLEEP["node"], "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["2", 0], "count": count, "vary": "color"},
        },
        "4": {
            "class_type": "Collect from the Fleet",
            "inputs": {"batch": ["3", 0], "failure_mode": "fail_fast"},
        },
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
    }


def child(seconds: float, color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": SLEEP["node"], "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }


async def run_to_done(session: aiohttp.ClientSession, url: str, prompts: list[Any]) -> float:
    """Seconds from the first submit to the last prompt's done signal, one at a time."""
    client = uuid.uuid4().hex
    async with session.ws_connect(f"{url}/ws?clientId={client}") as ws:
        started = time.perf_counter()
        for prompt in prompts:
            body = {"prompt": prompt, "client_id": client}
            async with session.post(f"{url}/prompt", json=body) as response:
                assert response.status == 200, await response.text()
                prompt_id = (await response.json())["prompt_id"]
            async for message in ws:
                frame = message.json() if message.type == aiohttp.WSMsgType.TEXT else {}
                data = frame.get("data") or {}
                ended = frame.get("type") == "executing" and data.get("node") is None
                if ended and data.get("prompt_id") == prompt_id:
                    break
                if frame.get("type") == "execution_error" and data.get("prompt_id") == prompt_id:
                    raise RuntimeError(f"the prompt failed: {data}")
        return time.perf_counter() - started


async def children_of(session: aiohttp.ClientSession, url: str, parent_id: str) -> list[Any]:
    async with session.get(f"{url}/api/jobs?limit=200") as response:
        jobs = (await response.json())["jobs"]
    return [job for job in jobs if job.get("parent") == parent_id]


async def cancel_time(session: aiohttp.ClientSession, url: str) -> float:
    async with session.post(f"{url}/prompt", json={"prompt": parent(8, 30.0, 7)}) as response:
        parent_id = (await response.json())["prompt_id"]
    while sum(j["status"] == "in_progress" for j in await children_of(session, url, parent_id)) < 4:
        await asyncio.sleep(0.05)
    started = time.perf_counter()
    async with session.post(f"{url}/api/jobs/{parent_id}/cancel") as response:
        assert response.status == 200
    while True:
        children = await children_of(session, url, parent_id)
        if len(children) == CHILDREN and all(j["status"] == "cancelled" for j in children):
            return time.perf_counter() - started
        await asyncio.sleep(0.01)


async def measure(repeat: int, root: Path, given: list[str]) -> None:
    ports = [free_port() for _ in range(BACKENDS)] if not given else []
    processes = [
        serve(root / f"b{i}", port, "--local-slots", "1", "--testing-nodes")
        for i, port in enumerate(ports)
    ]
    urls = given or [f"http://127.0.0.1:{port}" for port in ports]
    gateway_port = free_port()
    flags = [f for url in urls for f in ("--backend", url)]
    single = [f"--backend={urls[0]}"]
    try:
        for backend in urls:
            await wait_ready(backend)
        processes.append(serve(root / "gw", gateway_port, "--local-slots", "1", *flags))
        url = f"http://127.0.0.1:{gateway_port}"
        await wait_ready(url)
        serial_port = free_port()
        processes.append(serve(root / "gw1", serial_port, "--local-slots", "1", *single))
        serial_url = f"http://127.0.0.1:{serial_port}"
        await wait_ready(serial_url)
        await asyncio.sleep(1.0)  # every backend connected
        async with aiohttp.ClientSession() as session:
            batches, serials = [], []
            for n in range(repeat):
                batches.append(await run_to_done(session, url, [parent(8, SECONDS, 100 + n)]))
                prompts = [child(SECONDS, 200 + 10 * n + i) for i in range(CHILDREN)]
                serials.append(await run_to_done(session, serial_url, prompts))
                print(f"  run {n + 1}: batch {batches[-1]:.3f} s, serial {serials[-1]:.3f} s")
            batch, serial = statistics.median(batches), statistics.median(serials)
            print(
                f"8 x 1 s children over 4 backends: {batch:.3f} s (serial on one: {serial:.3f} s)"
            )
            figure("batch_8x1s", batch, "s", serial)
            cancelled = await cancel_time(session, url)
            print(f"cancel the parent -> every child cancelled: {cancelled * 1e3:.0f} ms")
            figure("cancel_children", cancelled * 1e3, "ms")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="", help="four running servers, comma-separated")
    parser.add_argument("--sleep-node", default="Sleep")
    args = parser.parse_args()
    SLEEP["node"] = args.sleep_node
    given = [url for url in args.backends.split(",") if url]
    if given and len(given) != BACKENDS:
        parser.error(f"--backends takes {BACKENDS} URLs")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(args.repeat, Path(tmp), given))
