"""The cost of `GET /metrics` on the server's throughput.

bench_gateway's client (trivial prompts, `--in-flight` at a time, each done when its
`executing {node: null}` reaches the WebSocket) against a `comfyfleet serve
--local-slots 8` process, three ways in the same run, each on a fresh server:

- no scraper: the baseline;
- a scraper reading `/metrics` every second (what a Prometheus does);
- a scraper every 0.1 s (ten times that: the cost made visible).

The runs alternate (`--rounds` rounds of the three), and each figure is the median of
its rounds, so the machine's drift spreads over all three. Also: the time one scrape
takes while the server is busy (p50, p99), its time on the same server once idle
(what a scrape costs by itself, history of the run included), and the answer's size.

    .venv/bin/python bench/bench_metrics.py [--prompts N] [--in-flight K] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import through_server
from figures import figure
from harness import free_port, percentile, serve

#: (name, seconds between scrapes; None: no scraper).
RUNS: list[tuple[str, float | None]] = [("none", None), ("every_1s", 1.0), ("every_100ms", 0.1)]


async def scraper(url: str, every: float, times: list[float], sizes: list[int]) -> None:
    """GET /metrics every `every` seconds (on schedule) until cancelled."""
    async with aiohttp.ClientSession() as session:
        next_at = time.perf_counter()
        while True:
            started = time.perf_counter()
            async with session.get(url + "/metrics") as response:
                body = await response.read()
                assert response.status == 200, body[:200]
            times.append(time.perf_counter() - started)
            sizes.append(len(body))
            next_at += every
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


async def one_run(count: int, in_flight: int, every: float | None) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    times: list[float] = []
    sizes: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = serve(Path(tmp), port, "--local-slots", "8")
        try:
            await through_server(port, 30, in_flight, 10_000_000)  # warm-up
            scraping = None
            if every is not None:
                scraping = asyncio.create_task(scraper(url, every, times, sizes))
            figures = await through_server(port, count, in_flight, 0)
            if scraping is not None:
                scraping.cancel()
                await asyncio.gather(scraping, return_exceptions=True)
            idle = await idle_scrapes(url, 20)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {**figures, "scrapes": times, "sizes": sizes, "idle": idle}


async def idle_scrapes(url: str, count: int) -> list[float]:
    """`count` scrapes one after another on a server with nothing to do."""
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.get(url + "/metrics") as response:
                await response.read()
            times.append(time.perf_counter() - started)
    return times


async def main(count: int, in_flight: int, rounds: int) -> None:
    print(f"{count} trivial prompts, {in_flight} in flight, --local-slots 8, {rounds} rounds")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in RUNS}
    for round_ in range(rounds):
        for name, every in RUNS if round_ % 2 == 0 else RUNS[::-1]:
            result = await one_run(count, in_flight, every)
            results[name].append(result)
            print(
                f"  round {round_ + 1} {name:12s} {result['rate']:7.1f} prompts/s  "
                f"p50 {result['p50'] * 1e3:6.1f} ms  scrapes {len(result['scrapes'])}"
            )
    base = statistics.median(r["rate"] for r in results["none"])
    for name, _every in RUNS:
        runs = results[name]
        rate = statistics.median(r["rate"] for r in runs)
        p50 = statistics.median(r["p50"] for r in runs) * 1e3
        p99 = statistics.median(r["p99"] for r in runs) * 1e3
        print(
            f"  scraper {name:12s} {rate:7.1f} prompts/s ({rate / base:4.2f}x no scraper)  "
            f"submit -> done p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
        )
        figure(f"{name}_throughput", rate, "prompts/s", None if name == "none" else base)
        figure(f"{name}_submit_done_p50", p50, "ms")
        scrapes = [t for r in runs for t in r["scrapes"]]
        if scrapes:
            sizes = [s for r in runs for s in r["sizes"]]
            print(
                f"    one scrape under load: p50 {percentile(scrapes, 0.5) * 1e3:6.1f} ms  "
                f"p99 {percentile(scrapes, 0.99) * 1e3:6.1f} ms  ({len(scrapes)} scrapes, "
                f"{max(sizes)} bytes)"
            )
            figure(f"{name}_scrape_p50", percentile(scrapes, 0.5) * 1e3, "ms")
            figure(f"{name}_scrape_p99", percentile(scrapes, 0.99) * 1e3, "ms")
    idle = [t for runs in results.values() for r in runs for t in r["idle"]]
    print(f"  one scrape, idle server: p50 {percentile(idle, 0.5) * 1e3:6.2f} ms")
    figure("idle_scrape_p50", percentile(idle, 0.5) * 1e3, "ms")
    sizes = [s for r in results["every_1s"] for s in r["sizes"]]
    if sizes:
        figure("answer_size", max(sizes), "bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.prompts, options.in_flight, options.rounds))
