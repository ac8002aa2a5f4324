"""The fleet dashboard under 100 prompts a second: does it keep up, does the server slow?

One `comfyfleet serve --local-slots 16 --testing-nodes` process per run. Prompts
(PrimitiveInt -> PreviewAny, each distinct) are submitted at `--rate` a second for
`--seconds`, on schedule (not one after another), while `--dashboards` WebSocket
dashboards (`/api/fleet/ws`) and, when Debian's chromium is there, one real `/fleet` page
in headless Chromium watch. Figures:

- submit latency p50/p99 (POST /prompt) and the completion rate, against the same run
  with no dashboard (the baseline): the server must not slow down;
- snapshot lag p99: arrival minus the snapshot's own server time (same clock);
- catch-up: from the last prompt's end (its execution_end_time) to the moment a dashboard
  shows every prompt completed, worst dashboard, and the browser page's;
- snapshots a second per dashboard (coalesced: 4 at most while things change);
- with the browser page too (a third run): the page's render time per snapshot, p99 and
  max (its JavaScript, measured in the page), its catch-up, and the submit latency then
  (Chromium shares the machine's cores with the server: a cost of the machine, not of
  the server's work).

    .venv/bin/python bench/bench_dashboard.py [--rate 100] [--seconds 10] [--dashboards 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, percentile, serve, wait_ready

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The page's own clock: every render timed, every snapshot's completed count noted.
INSTRUMENT = """() => {
    window.benchRenders = []; window.benchDone = [];
    const original = window.render;
    window.render = (snapshot) => {
        const start = performance.now();
        original(snapshot);
        benchRenders.push(performance.now() - start);
        benchDone.push([Date.now() / 1000, snapshot.queue.finished.completed || 0]);
    };
}"""


def prompt(n: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": n}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


@dataclass
class Watcher:
    lags: list[float] = field(default_factory=list)
    done_at: list[tuple[float, int]] = field(default_factory=list)  # (arrival, completed)

    async def watch(self, session: aiohttp.ClientSession, url: str) -> None:
        async with session.ws_connect(url + "/api/fleet/ws", max_msg_size=0) as ws:
            async for message in ws:
                now = time.time()
                snapshot = json.loads(message.data)
                self.lags.append(now - snapshot["time"])
                self.done_at.append((now, snapshot["queue"]["finished"].get("completed", 0)))


def caught_up(done_at: list[tuple[float, int]], total: int) -> float:
    return next((at for at, done in done_at if done >= total), float("nan"))


async def submit_all(url: str, rate: float, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    count = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(n: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            start = time.monotonic()
            async with session.post(url + "/prompt", json={"prompt": prompt(n)}) as answer:
                assert answer.status == 200, await answer.text()
            latencies.append(time.monotonic() - start)

        t0 = time.monotonic() + 0.2
        await asyncio.gather(*(one(n, t0 + n / rate) for n in range(count)))
    return latencies, count


async def last_end(session: aiohttp.ClientSession, url: str, total: int) -> tuple[float, float]:
    """(the last prompt's end, first prompt's creation), in seconds, once all ended."""
    while True:
        async with session.get(url + "/api/jobs", params={"limit": 1000}) as answer:
            body = await answer.json()
        jobs = body["jobs"]
        if body["pagination"]["total"] >= total and all(j["status"] == "completed" for j in jobs):
            ends = [j["execution_end_time"] for j in jobs]
            starts = [j["create_time"] for j in jobs]
            return max(ends) / 1000, min(starts) / 1000
        await asyncio.sleep(0.1)


async def run(
    rate: float, seconds: float, dashboards: int, browser: Any | None
) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        process = serve(data, port, "--local-slots", "16", "--testing-nodes")
        try:
            await wait_ready(url)
            return await _measure(url, rate, seconds, dashboards, browser)
        finally:
            process.terminate()
            process.wait(30)


async def _measure(
    url: str, rate: float, seconds: float, dashboards: int, browser: Any | None
) -> dict[str, float]:
    page = None
    if browser is not None:
        page = await browser.new_page()
        await page.goto(url + "/fleet")
        await page.wait_for_function("() => typeof render === 'function'")
        await page.evaluate(INSTRUMENT)
    watchers = [Watcher() for _ in range(dashboards)]
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(w.watch(session, url)) for w in watchers]
        await asyncio.sleep(0.5)
        latencies, total = await submit_all(url, rate, seconds)
        end, start = await last_end(session, url, total)
        await asyncio.sleep(2.5)  # time enough for the dashboards to show the end
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out = {
        "submit_p50": percentile(latencies, 0.5) * 1000,
        "submit_p99": percentile(latencies, 0.99) * 1000,
        "rate": total / (end - start),
    }
    if watchers:
        lags = [lag for w in watchers for lag in w.lags]
        out["lag_p99"] = percentile(lags, 0.99) * 1000
        out["catch_up"] = max(caught_up(w.done_at, total) - end for w in watchers) * 1000
        out["per_second"] = sum(len(w.lags) for w in watchers) / len(watchers) / (end - start)
    if page is not None:
        renders = await page.evaluate("benchRenders")
        done = [tuple(d) for d in await page.evaluate("benchDone")]
        out["page_render_p99"] = percentile(renders, 0.99)
        out["page_render_max"] = max(renders)
        out["page_renders"] = len(renders)
        out["page_catch_up"] = (caught_up(done, total) - end) * 1000
        await page.close()
    return out


async def main(args: argparse.Namespace) -> None:
    baseline = await run(args.rate, args.seconds, 0, None)
    print(f"no dashboard: {baseline}")
    watched = await run(args.rate, args.seconds, args.dashboards, None)
    print(f"{args.dashboards} dashboards: {watched}")
    figure("submit_p50_ms", watched["submit_p50"], "ms", baseline["submit_p50"])
    figure("submit_p99_ms", watched["submit_p99"], "ms", baseline["submit_p99"])
    figure("completion_rate", watched["rate"], "prompts/s", baseline["rate"])
    figure("snapshot_lag_p99_ms", watched["lag_p99"], "ms")
    figure("catch_up_worst_dashboard_ms", watched["catch_up"], "ms")
    figure("snapshots_per_second", watched["per_second"], "1/s")
    if not shutil.which(CHROMIUM):
        print(f"no browser at {CHROMIUM}: the page's figures are left out")
        return
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        paged = await run(args.rate, args.seconds, args.dashboards, browser)
        await browser.close()
    print(f"{args.dashboards} dashboards and a page: {paged}")
    figure("page_render_p99_ms", paged["page_render_p99"], "ms")
    figure("page_render_max_ms", paged["page_render_max"], "ms")
    figure("page_renders", paged["page_renders"], "count")
    figure("page_catch_up_ms", paged["page_catch_up"], "ms")
    figure("with_page_submit_p99_ms", paged["submit_p99"], "ms", baseline["submit_p99"])
    figure("with_page_completion_rate", paged["rate"], "prompts/s", baseline["rate"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--dashboards", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
