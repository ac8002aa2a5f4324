"""End-to-end throughput and latency of the server on trivial prompts.

A `comfyfleet serve` process (SQLite store, every state change committed)
runs EmptyImage 64x64 -> ImageInvert -> SaveImage prompts with distinct
colours (no cache hits). A client in this process keeps `--in-flight`
prompts submitted over HTTP and counts each one done when its
`executing {node: null}` arrives on the WebSocket.

Baseline, measured in the same run: the built-in engine alone, in this
process, with the same concurrency (no HTTP, no WebSocket, no store). With
`--comfyui URL` the same client also measures a running ComfyUI (started
separately: this benchmark does not install one) and the server's figures are
compared with it instead. With `--store URL` (a PostgreSQL server) the server with 8
slots also runs with its store in a fresh database there, and that run is compared
with the SQLite one (`pg_vs_sqlite`).

    .venv/bin/python bench/bench_gateway.py [--prompts N] [--in-flight K] [--comfyui URL]
        [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import trivial_prompt
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from figures import figure
from harness import free_port, mark_done, percentile, serve, throwaway_database, wait_ready

COMFYUI_REFERENCE = "one ComfyUI 0.3.64 process: about 200-330 such prompts/s on this machine kind"


async def engine_baseline(count: int, in_flight: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(build_registry(), Folders.under(Path(tmp)))
        gate = asyncio.Semaphore(in_flight)

        async def one(color: int) -> None:
            async with gate:
                await engine.run_prompt(trivial_prompt(color))

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        elapsed = time.perf_counter() - start
        engine.close()
    return count / elapsed


async def through_server(port: int, count: int, in_flight: int, offset: int) -> dict[str, Any]:
    return await through_url(f"http://127.0.0.1:{port}", count, in_flight, offset)


async def through_url(url: str, count: int, in_flight: int, offset: int) -> dict[str, Any]:
    client_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        await wait_ready(url)
        ws = await session.ws_connect(f"{url}/ws?clientId={client_id}")
        done: dict[str, asyncio.Future[float]] = {}

        reading = asyncio.create_task(mark_done(ws, done))
        gate = asyncio.Semaphore(in_flight)
        latencies: list[float] = []

        async def one(color: int) -> None:
            async with gate:
                prompt_id = str(uuid.uuid4())
                done[prompt_id] = asyncio.get_running_loop().create_future()
                body = {
                    "prompt": trivial_prompt(color),
                    "client_id": client_id,
                    "prompt_id": prompt_id,
                }
                sent = time.perf_counter()
                async with session.post(url + "/prompt", json=body) as response:
                    assert response.status == 200, await response.text()
                latencies.append(await done[prompt_id] - sent)

        start = time.perf_counter()
        await asyncio.gather(*(one(offset + i) for i in range(count)))
        elapsed = time.perf_counter() - start
        reading.cancel()
        await ws.close()
    return {
        "rate": count / elapsed,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
    }


async def one_server(count: int, in_flight: int, *flags: str) -> dict[str, Any]:
    """A fresh server with `flags`: warmed up, then measured."""
    port = free_port()  # benchmarks may run side by side
    with tempfile.TemporaryDirectory() as tmp:
        server = serve(Path(tmp), port, *flags)
        try:
            await through_server(port, 30, in_flight, 10_000_000)  # warm-up
            return await through_server(port, count, in_flight, 0)
        finally:
            server.terminate()
            server.wait(timeout=30)


async def main(count: int, in_flight: int, comfyui: str | None) -> float:
    print(f"{count} trivial prompts (EmptyImage 64x64 -> ImageInvert -> SaveImage)")
    print(f"  {in_flight} in flight at a time")
    base = await engine_baseline(count, in_flight)
    print(f"  baseline: engine alone, in process          {base:7.1f} prompts/s")
    if comfyui is not None:
        await through_url(comfyui, 30, in_flight, 12_000_000)  # warm-up
        theirs = await through_url(comfyui, count, in_flight, 13_000_000)
        base = theirs["rate"]
        print(
            f"  baseline: ComfyUI at {comfyui}: {base:7.1f} prompts/s   submit -> done "
            f"p50 {theirs['p50'] * 1e3:6.1f} ms  p99 {theirs['p99'] * 1e3:6.1f} ms"
        )
        figure("comfyui_throughput", base, "prompts/s")
        figure("comfyui_submit_done_p50", theirs["p50"] * 1e3, "ms")
    for slots in (1, 8):
        figures = await one_server(count, in_flight, "--local-slots", str(slots))
        print(
            f"  server, --local-slots {slots}:  {figures['rate']:7.1f} prompts/s "
            f"({figures['rate'] / base:4.2f}x baseline)   submit -> done "
            f"p50 {figures['p50'] * 1e3:6.1f} ms  p99 {figures['p99'] * 1e3:6.1f} ms"
        )
        figure(f"slots{slots}_throughput", figures["rate"], "prompts/s", base)
        figure(f"slots{slots}_submit_done_p50", figures["p50"] * 1e3, "ms")
        figure(f"slots{slots}_submit_done_p99", figures["p99"] * 1e3, "ms")
    if comfyui is None:
        print(f"  for scale: {COMFYUI_REFERENCE}")
    rate: float = figures["rate"]
    return rate


def compare_stores(count: int, in_flight: int, server_url: str, sqlite_rate: float) -> None:
    """The 8-slot server again, its store on PostgreSQL, against the SQLite run."""
    with throwaway_database(server_url) as database:
        flags = ("--local-slots", "8", "--store", database)
        figures = asyncio.run(one_server(count, in_flight, *flags))
    rate = figures["rate"]
    print(
        f"  server, --local-slots 8, PostgreSQL: {rate:7.1f} prompts/s "
        f"({rate / sqlite_rate:4.2f}x SQLite)   submit -> done "
        f"p50 {figures['p50'] * 1e3:6.1f} ms  p99 {figures['p99'] * 1e3:6.1f} ms"
    )
    figure("slots8_postgresql_throughput", rate, "prompts/s", sqlite_rate)
    figure("slots8_postgresql_submit_done_p50", figures["p50"] * 1e3, "ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--comfyui", metavar="URL", help="a running ComfyUI to measure too")
    parser.add_argument("--store", metavar="URL", help="a PostgreSQL server to compare with")
    options = parser.parse_args()
    sqlite_rate = asyncio.run(main(options.prompts, options.in_flight, options.comfyui))
    if options.store:
        compare_stores(options.prompts, options.in_flight, options.store, sqlite_rate)
