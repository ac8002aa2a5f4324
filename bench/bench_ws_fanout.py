"""WebSocket fan-out: many clients on one server, each seeing only its own prompts' events.

One `comfyfleet serve --local-slots 8 --testing-nodes` process. `--clients`
WebSocket clients (default 500) connect, each with its own clientId, then each
submits `--per-client` prompts one after another (EmptyImage 8x8 -> Progress,
5 steps -> PreviewAny), waiting for its `executing {node: null}` before the
next. Figures:

- event latency: arrival time minus the frame's own server timestamp, for the
  frames that carry one (execution_start, execution_success; same machine, same
  clock), p50/p99;
- submit -> done: POST /prompt to that prompt's `executing {node: null}`, p50/p99;
- misrouted frames: frames carrying a prompt_id the receiving client did not
  submit (target 0), and prompts whose done frame never arrived (target 0).

Baseline, measured in the same run: the same with 1 client (submitting
max(per-client, 50) prompts, for enough samples).

    .venv/bin/python bench/bench_ws_fanout.py [--clients 500] [--per-client 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import BIN, free_port, percentile, wait_ready


def progress_prompt(color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {
            "class_type": "Progress",
            "inputs": {"value": ["1", 0], "steps": 5, "seconds_per_step": 0.0},
        },
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@dataclass
class Tally:
    event_latency: list[float] = field(default_factory=list)  # ms
    submit_done: list[float] = field(default_factory=list)  # ms
    frames: int = 0
    misrouted: int = 0
    missing: int = 0


async def client(
    session: aiohttp.ClientSession,
    url: str,
    count: int,
    first_color: int,
    tally: Tally,
    connected: asyncio.Event,
    go: asyncio.Event,
    timeout: float,
) -> None:
    client_id = uuid.uuid4().hex
    ws = await session.ws_connect(f"{url.replace('http', 'ws', 1)}/ws?clientId={client_id}")
    mine: set[str] = set()
    done: dict[str, asyncio.Future[float]] = {}
    connected.set()

    async def reader() -> None:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            arrived = time.time() * 1000
            frame = json.loads(message.data)
            data = frame.get("data") or {}
            prompt_id = data.get("prompt_id") if isinstance(data, dict) else None
            if prompt_id is None:
                continue  # status broadcasts carry no prompt_id
            tally.frames += 1
            if prompt_id not in mine:
                tally.misrouted += 1
                continue
            if "timestamp" in data:
                tally.event_latency.append(arrived - data["timestamp"])
            if frame["type"] == "executing" and data.get("node") is None:
                future = done.get(prompt_id)
                if future is not None and not future.done():
                    future.set_result(time.perf_counter())

    reading = asyncio.create_task(reader())
    await go.wait()
    try:
        for i in range(count):
            prompt_id = str(uuid.uuid4())
            mine.add(prompt_id)
            done[prompt_id] = asyncio.get_running_loop().create_future()
            body = {
                "prompt": progress_prompt(first_color + i),
                "client_id": client_id,
                "prompt_id": prompt_id,
            }
            sent = time.perf_counter()
            async with session.post(url + "/prompt", json=body) as response:
                assert response.status == 200, await response.text()
            try:
                finished = await asyncio.wait_for(done[prompt_id], timeout)
            except TimeoutError:
                tally.missing += 1
                continue
            tally.submit_done.append((finished - sent) * 1000)
        await asyncio.sleep(0.2)  # late frames that would be misrouted
    finally:
        reading.cancel()
        await ws.close()


async def run(url: str, clients: int, per_client: int, color: int) -> tuple[Tally, float]:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        go = asyncio.Event()
        flags = [asyncio.Event() for _ in range(clients)]
        tasks = [
            asyncio.create_task(
                client(session, url, per_client, color + n * per_client, tally, flag, go, 120)
            )
            for n, flag in enumerate(flags)
        ]
        for flag in flags:
            await flag.wait()
        start = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return tally, elapsed


def report(label: str, tally: Tally, elapsed: float, prompts: int) -> None:
    print(
        f"  {label:<12} {prompts:5d} prompts in {elapsed:6.2f} s   event latency p50 "
        f"{percentile(tally.event_latency, 0.5):7.1f} ms  p99 "
        f"{percentile(tally.event_latency, 0.99):7.1f} ms   submit -> done p50 "
        f"{percentile(tally.submit_done, 0.5):7.1f} ms  p99 "
        f"{percentile(tally.submit_done, 0.99):7.1f} ms   frames {tally.frames}   "
        f"misrouted {tally.misrouted}   missing {tally.missing}"
    )


async def main(clients: int, per_client: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        command = [BIN, "serve", "--port", str(port), "--data-dir", tmp, "--local-slots", "8"]
        command += ["--testing-nodes", "--log-level", "WARNING"]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            await wait_ready(url, timeout=30.0)
            await run(url, 4, 5, 10_000_000)  # warm-up
            single = max(per_client, 50)
            base, base_elapsed = await run(url, 1, single, 0)
            many, elapsed = await run(url, clients, per_client, 1_000_000)
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"WebSocket fan-out, one server with --local-slots 8, {per_client} prompt(s) per client")
    report("1 client", base, base_elapsed, single)
    report(f"{clients} clients", many, elapsed, clients * per_client)
    b50, b99 = percentile(base.event_latency, 0.5), percentile(base.event_latency, 0.99)
    d50, d99 = percentile(base.submit_done, 0.5), percentile(base.submit_done, 0.99)
    figure(f"clients{clients}_event_latency_p50", percentile(many.event_latency, 0.5), "ms", b50)
    figure(f"clients{clients}_event_latency_p99", percentile(many.event_latency, 0.99), "ms", b99)
    figure(f"clients{clients}_submit_done_p50", percentile(many.submit_done, 0.5), "ms", d50)
    figure(f"clients{clients}_submit_done_p99", percentile(many.submit_done, 0.99), "ms", d99)
    figure(
        f"clients{clients}_throughput",
        clients * per_client / elapsed,
        "prompts/s",
        single / base_elapsed,
    )
    figure(f"clients{clients}_misrouted_frames", many.misrouted, "count", base.misrouted)
    figure(f"clients{clients}_missing_done", many.missing, "count", base.missing)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--per-client", type=int, default=2)
    options = parser.parse_args()
    asyncio.run(main(options.clients, options.per_client))
