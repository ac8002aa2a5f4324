"""Following prompts: event latency for a late WebSocket subscriber and over SSE, against
the prompt's own WebSocket client in the same run; and what the event log costs.

One `comfyfleet serve --local-slots 16` process with a node that reports progress 100
times a second, each `progress` frame carrying the server's wall clock as its value.
`--prompts` such prompts run at once, `--rounds` times. Each has three clients:

- its own WebSocket client (connected before the submit, by client_id): the baseline;
- a late subscriber: another socket that sends `subscribe` once the prompt has sent
  `--join-after` progress frames (it gets the replay, then the rest live);
- an SSE reader (`GET /api/jobs/{id}/events`) started at the same moment.

Latency = arrival minus the frame's server time (one machine, one clock), over the frames
sent after the late clients joined. Also: the late subscriber's catch-up (subscribe sent
to the first live frame), and the completion rate of `--burst` trivial prompts with the
log on against `--events-retention 0` (no log), each on a fresh server, best of three.

    .venv/bin/python bench/bench_follow.py [--prompts 8] [--rounds 3] [--ticks 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dashboard import prompt as trivial_prompt  # PrimitiveInt -> PreviewAny
from figures import figure
from harness import free_port, percentile, serve, wait_ready

#: A node that reports progress every `every` seconds, the wall clock as the value.
CLOCK_NODE = """
import asyncio, time
from comfyfleet.engine.context import ProgressBar

class ClockTicks:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ticks": ("INT", {"default": 100, "min": 1, "max": 100000}),
                             "every": ("FLOAT", {"default": 0.01, "min": 0.0, "max": 1.0}),
                             "seed": ("INT", {"default": 0})},
                "hidden": {"unique_id": "UNIQUE_ID"}}
    RETURN_TYPES = ("INT",)
    OUTPUT_NODE = True
    FUNCTION = "run"
    CATEGORY = "bench"

    async def run(self, ticks, every, seed, unique_id=None):
        bar = ProgressBar(1e12, node_id=unique_id)
        for _ in range(ticks):
            bar.update_absolute(time.time())
            await asyncio.sleep(every)
        return {"ui": {"ticks": [ticks]}, "result": (ticks,)}

NODE_CLASS_MAPPINGS = {"ClockTicks": ClockTicks}
"""


def clock_prompt(ticks: int, seed: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "ClockTicks", "inputs": {"ticks": ticks, "every": 0.01, "seed": seed}}
    }


@dataclass
class Arrivals:
    """(server time, arrival time) of each progress frame a client got."""

    frames: list[tuple[float, float]] = field(default_factory=list)

    def note(self, data: dict[str, Any]) -> None:
        self.frames.append((data["value"], time.time()))

    def latencies(self, since: float) -> list[float]:
        return [arrived - sent for sent, arrived in self.frames if sent >= since]


@dataclass
class Followed:
    owner: Arrivals = field(default_factory=Arrivals)
    late: Arrivals = field(default_factory=Arrivals)
    sse: Arrivals = field(default_factory=Arrivals)
    joined: float = 0.0  # wall time the late clients started
    catch_up: float = float("nan")  # subscribe sent -> first live frame


async def _read_ws(ws: aiohttp.ClientWebSocketResponse, into: Arrivals, prompt_id: str) -> None:
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            continue
        event = json.loads(message.data)
        data = event["data"]
        if not isinstance(data, dict) or data.get("prompt_id") != prompt_id:
            continue
        if event["type"] == "progress":
            into.note(data)
        elif event["type"] == "executing" and data.get("node") is None:
            return


async def _read_sse(session: aiohttp.ClientSession, url: str, into: Arrivals) -> None:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        kind = ""
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if kind == "progress":
                    into.note(data)
                elif kind == "executing" and data.get("node") is None:
                    return


async def follow_one(
    session: aiohttp.ClientSession, url: str, ticks: int, join_after: int, seed: int
) -> Followed:
    client_id = uuid.uuid4().hex
    result = Followed()
    ws_url = url.replace("http", "ws") + "/ws"
    async with (
        session.ws_connect(f"{ws_url}?clientId={client_id}") as owner,
        session.ws_connect(f"{ws_url}?clientId={uuid.uuid4().hex}") as late,
    ):
        body = {"prompt": clock_prompt(ticks, seed), "client_id": client_id}
        async with session.post(url + "/prompt", json=body) as answer:
            assert answer.status == 200, await answer.text()
            prompt_id = (await answer.json())["prompt_id"]
        owning = asyncio.create_task(_read_ws(owner, result.owner, prompt_id))
        while len(result.owner.frames) < join_after:
            await asyncio.sleep(0.005)
        result.joined = time.time()
        await late.send_json({"type": "subscribe", "data": {"prompt_id": prompt_id}})
        following = asyncio.create_task(_read_ws(late, result.late, prompt_id))
        streaming = asyncio.create_task(
            _read_sse(session, f"{url}/api/jobs/{prompt_id}/events", result.sse)
        )
        await asyncio.gather(owning, following, streaming)
    live = [arrived for sent, arrived in result.late.frames if sent >= result.joined]
    if live:
        result.catch_up = live[0] - result.joined
    return result


async def latency_run(args: argparse.Namespace, nodes: Path) -> list[Followed]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        process = serve(data, port, "--local-slots", "16", "--custom-nodes", str(nodes))
        try:
            await wait_ready(url)
            followed: list[Followed] = []
            async with aiohttp.ClientSession() as session:
                for round_ in range(args.rounds):
                    followed += await asyncio.gather(
                        *(
                            follow_one(session, url, args.ticks, args.join_after, round_ * 100 + n)
                            for n in range(args.prompts)
                        )
                    )
            return followed
        finally:
            process.terminate()
            process.wait(30)


async def burst_rate(burst: int, *extra: str) -> float:
    """Prompts a second for `burst` trivial prompts submitted at once (first created to
    last ended)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        process = serve(data, port, "--local-slots", "16", "--testing-nodes", *extra)
        try:
            await wait_ready(url)
            connector = aiohttp.TCPConnector(limit=32)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def one(n: int) -> None:
                    body = {"prompt": trivial_prompt(n)}
                    async with session.post(url + "/prompt", json=body) as answer:
                        assert answer.status == 200, await answer.text()

                await asyncio.gather(*(one(n) for n in range(burst)))
                while True:
                    params: dict[str, str | int] = {"limit": 1000, "status": "completed"}
                    async with session.get(url + "/api/jobs", params=params) as answer:
                        body = await answer.json()
                    if body["pagination"]["total"] >= burst:
                        break
                    await asyncio.sleep(0.05)
                params = {"limit": 1000}
                async with session.get(url + "/api/jobs", params=params) as answer:
                    jobs = (await answer.json())["jobs"]
            ends = max(j["execution_end_time"] for j in jobs) / 1000
            starts = min(j["create_time"] for j in jobs) / 1000
            return float(burst / (ends - starts))
        finally:
            process.terminate()
            process.wait(30)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as nodes:
        (Path(nodes) / "clock_ticks.py").write_text(CLOCK_NODE)
        followed = await latency_run(args, Path(nodes))
    owner = [lat for f in followed for lat in f.owner.latencies(f.joined)]
    late = [lat for f in followed for lat in f.late.latencies(f.joined)]
    sse = [lat for f in followed for lat in f.sse.latencies(f.joined)]
    catch_up = [f.catch_up for f in followed]
    missing = sum(len(f.owner.frames) - len(f.late.frames) for f in followed)
    missing += sum(len(f.owner.frames) - len(f.sse.frames) for f in followed)
    print(
        f"{len(followed)} prompts, {len(owner)} live frames each way; "
        f"frames the followers lacked: {missing}"
    )
    ms = 1000.0
    owner_p50, owner_p99 = percentile(owner, 0.5) * ms, percentile(owner, 0.99) * ms
    figure("owner_ws_p50_ms", owner_p50, "ms")
    figure("owner_ws_p99_ms", owner_p99, "ms")
    figure("late_subscriber_p50_ms", percentile(late, 0.5) * ms, "ms", owner_p50)
    figure("late_subscriber_p99_ms", percentile(late, 0.99) * ms, "ms", owner_p99)
    figure("sse_p50_ms", percentile(sse, 0.5) * ms, "ms", owner_p50)
    figure("sse_p99_ms", percentile(sse, 0.99) * ms, "ms", owner_p99)
    figure("late_subscriber_catch_up_p50_ms", percentile(catch_up, 0.5) * ms, "ms")
    figure("frames_lacking", missing, "count")
    # Alternated, best of three each: the machine is shared, and a run that was slowed by
    # something else says nothing of the log.
    withouts, loggeds = [], []
    for _ in range(3):
        withouts.append(await burst_rate(args.burst, "--events-retention", "0"))
        loggeds.append(await burst_rate(args.burst))
    without, logged = max(withouts), max(loggeds)
    print(f"burst of {args.burst}, prompts/s: with the log {loggeds}, without {withouts}")
    figure("burst_rate_with_log", logged, "prompts/s", without)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts followed at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ticks", type=int, default=200, help="progress frames per prompt")
    parser.add_argument("--join-after", type=int, default=50, help="frames before joining")
    parser.add_argument("--burst", type=int, default=1000, help="prompts for the cost figure")
    asyncio.run(main(parser.parse_args()))
