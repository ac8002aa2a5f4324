"""Fan-out of paid API jobs against the local provider emulator, through the engine.

1. 30 FLUX jobs of LATENCY seconds through one collector, as the first prompt of a
   fresh service and once more as the next prompt: wall time against the ideal (one
   job's time) and against running them one after another.
2. 300 jobs through ten collectors with the image pool at 30 running + 30 pending:
   wall time against the ideal of ten waves, and the "waiting for a slot" texts the
   prompt's client was sent.
3. Pace: 30 jobs against a provider that takes 20 job requests a second and answers
   the rest 429 with Retry-After (median of three fresh runs; ideal 1 s + LATENCY).
4. A storm: 20% of job-creating requests answered 500 and a per-key rate limit
   answered 429 with Retry-After; duplicate jobs at the emulator (target 0).

Every job asks for 512x512 (0.25 MP, 1:1): the emulator answers with 512x512 PNGs,
which are downloaded, decoded and journaled as a real provider's would be. Jobs go
through the real pools and a SQLite journal; the emulator is a real aiohttp server on
127.0.0.1, in the same process and event loop (so its own work counts against the
figures).

    .venv/bin/python bench/bench_fanout.py [--latency 2] [--storm-jobs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from comfyfleet.engine.events import EngineEvent, ProgressText
from comfyfleet.engine.executor import Engine
from comfyfleet.fanout import FanoutService, FanoutSettings, PoolSize, SecretVault
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.providers import DRIVERS
from comfyfleet.store.sqlite import SQLiteStore
from comfyfleet.testing.emulators.app import build_emulator_app, emulator_state
from comfyfleet.testing.emulators.state import EmulatorSettings, EmulatorState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure

SLOTS = 30
RESULT_SIZE = (512, 512)  # what "0.25 MP" at 1:1 asks the FLUX.2 models for


def batch(url: str, jobs: int, tag: str) -> dict[str, Any]:
    """Settings, `jobs` submits with distinct seeds, collectors of 30 in placeholder mode."""
    prompt: dict[str, Any] = {
        "api": {
            "class_type": "APISettings",
            "inputs": {"base_url": url, "api_key": "", "poll_interval": 0.1},
        }
    }
    for n in range(jobs):
        prompt[f"s{n}"] = {
            "class_type": "Concurrent Submit | BFLFluxImage",
            "inputs": {
                "prompt": f"{tag} variant {n}",
                "resolution": "0.25 MP",
                "aspect_ratio": "1:1",
                "grounding": False,
                "safety_tolerance": 2,
                "seed": n,
                "model": "flux-2-pro",
                "api_config": ["api", 0],
            },
        }
    for c, start in enumerate(range(0, jobs, SLOTS)):
        tasks = {f"task_{k + 1}": [f"s{n}", 0] for k, n in enumerate(range(start, jobs)[:SLOTS])}
        inputs = {**tasks, "failure_mode": "placeholder"}
        prompt[f"c{c}"] = {"class_type": "Concurrent Collect Images (30)", "inputs": inputs}
    return prompt


class TextCounter:
    """An event sink counting the progress texts a client of the prompt would receive."""

    def __init__(self) -> None:
        self.texts = 0

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, ProgressText):
            self.texts += 1


async def run_batch(
    engine: Engine, prompt: dict[str, Any], sink: TextCounter | None = None
) -> tuple[float, dict[str, int]]:
    started = time.perf_counter()
    checked, result = await engine.run_prompt(prompt, sink=sink or TextCounter())
    elapsed = time.perf_counter() - started
    assert checked.ok and result is not None and result.completed, result and result.error
    counts: dict[str, int] = {}
    for node, ui in result.outputs.items():
        if node.startswith("c"):
            for state, n in json.loads(ui["text"][0])["counts"].items():
                counts[state] = counts.get(state, 0) + n
    counts.pop("not_connected", None)
    return elapsed, counts


async def rig(tmp: Path, settings: FanoutSettings) -> tuple[Engine, FanoutService, SQLiteStore]:
    store = SQLiteStore(tmp / f"journal-{time.monotonic_ns()}.db", synchronous="NORMAL")
    await store.open()
    service = FanoutService(store, SecretVault(env={}), settings, DRIVERS)
    await service.resume()  # as `comfyfleet serve` does at start-up, before any prompt
    engine = Engine(build_registry(), Folders.under(tmp), services=service.services())
    return engine, service, store


async def close(engine: Engine, service: FanoutService, store: SQLiteStore) -> None:
    await service.close()
    engine.close()
    await store.close()


async def emulator(**dials: Any) -> tuple[TestServer, EmulatorState]:
    app = build_emulator_app(EmulatorSettings(jitter=0.0, seed=7, **dials))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, emulator_state(app)


async def throughput(
    tmp: Path, latency: float, jobs: int, pool: PoolSize, *, again: bool = False
) -> None:
    """`jobs` jobs as the first prompt of a fresh service; with `again`, the same number
    once more on that service (its connections and journal warm), as the next prompt."""
    server, state = await emulator(latency=latency)
    parts = await rig(tmp, FanoutSettings(image=pool))
    texts = TextCounter()
    try:
        url = str(server.make_url("")).rstrip("/")
        elapsed, counts = await run_batch(parts[0], batch(url, jobs, f"t{jobs}"), texts)
        if again:
            warm, warm_counts = await run_batch(parts[0], batch(url, jobs, f"w{jobs}"))
    finally:
        await close(*parts)
        await server.close()
    sizes = {task.size for task in state.tasks.values()}
    assert sizes == {RESULT_SIZE}, sizes
    waves = math.ceil(jobs / pool.concurrency)
    ideal = waves * latency
    print(
        f"  {jobs:4d} jobs x {latency:g} s, pool {pool.concurrency}+{pool.pending}, "
        f"{RESULT_SIZE[0]}x{RESULT_SIZE[1]} PNGs: {elapsed:6.2f} s   ideal {ideal:6.2f} s "
        f"({waves} wave(s))   ratio {elapsed / ideal:5.3f}x   serial would be "
        f"{jobs * latency:7.1f} s   ok {counts.get('success', 0)}   jobs at emulator "
        f"{state.stats()['jobs']}   progress texts {texts.texts}"
    )
    # Baseline: the ideal wall time (every wave exactly one job's latency).
    figure(f"jobs{jobs}_wall", elapsed, "s", ideal)
    figure(f"jobs{jobs}_ok", counts.get("success", 0), "count", jobs)
    if again:
        print(f"         the same again on the warm service: {warm:6.2f} s")
        figure(f"jobs{jobs}_warm_wall", warm, "s", ideal)
        figure(f"jobs{jobs}_warm_ok", warm_counts.get("success", 0), "count", jobs)
    if jobs > pool.concurrency + pool.pending:
        # "waiting for a slot, N ahead" texts; baseline: one per job.
        figure(f"jobs{jobs}_waiting_texts", texts.texts, "count", jobs)


async def paced(tmp: Path, latency: float, rate: float = 20.0, jobs: int = 30) -> None:
    """`jobs` jobs through one collector against `rate` job-creating requests a second
    (the emulator answers the rest 429 with Retry-After), each run on a fresh service:
    the median of three against the ideal (the rest wait one second, then `latency`)."""
    walls: list[float] = []
    refused: list[int] = []
    for run in range(3):
        server, state = await emulator(latency=latency, rate_limit=rate, retry_after=None)
        parts = await rig(tmp, FanoutSettings(image=PoolSize(jobs, jobs)))
        try:
            url = str(server.make_url("")).rstrip("/")
            elapsed, counts = await run_batch(parts[0], batch(url, jobs, f"paced{run}"))
        finally:
            await close(*parts)
            await server.close()
        stats = state.stats()
        assert counts.get("success", 0) == jobs and stats["duplicates"] == 0, (counts, stats)
        walls.append(elapsed)
        refused.append(stats["rate_limited"])
    median = sorted(walls)[1]
    ideal = math.ceil(jobs / rate) - 1 + latency
    print(
        f"  {jobs} jobs x {latency:g} s against {rate:g} job requests/s: median {median:5.2f} s "
        f"(runs {', '.join(f'{w:.2f}' for w in walls)})   ideal {ideal:5.2f} s   "
        f"429s per run {refused}   ok {jobs}/{jobs}, none sent twice"
    )
    figure(f"paced{jobs}_wall", median, "s", ideal)


async def storm(tmp: Path, jobs: int) -> None:
    server, state = await emulator(
        latency=0.5, fail_rate=0.2, rate_limit=20.0, retry_after=None, max_active=None
    )
    parts = await rig(tmp, FanoutSettings())
    try:
        url = str(server.make_url("")).rstrip("/")
        elapsed, counts = await run_batch(parts[0], batch(url, jobs, "storm"))
    finally:
        await close(*parts)
        await server.close()
    stats = state.stats()
    print(
        f"  {jobs} jobs, 20% 5xx + 429 over 20 jobs/s: {elapsed:6.2f} s   "
        f"requests {stats['create_requests']} (500: {stats['failed']}, "
        f"429: {stats['rate_limited']})   jobs {stats['jobs']}   ok {counts.get('success', 0)}   "
        f"failed {counts.get('failed', 0)}   duplicates {stats['duplicates']} (target 0)"
    )
    figure("storm_wall", elapsed, "s")
    figure("storm_ok", counts.get("success", 0), "count", jobs)
    figure("storm_failed_cleanly", counts.get("failed", 0), "count")
    figure("storm_duplicates", stats["duplicates"], "count")


async def main(latency: float, storm_jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("fan-out against the provider emulator (engine, pools, SQLite journal)")
        await throughput(root, latency, 30, PoolSize(30, 30), again=True)
        await throughput(root, latency, 300, PoolSize(30, 30))
        await paced(root, latency)
        await storm(root, storm_jobs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per job")
    parser.add_argument("--storm-jobs", type=int, default=100)
    args = parser.parse_args()
    # The storm makes the clients log every retry; the figures are the point here.
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(args.latency, args.storm_jobs))
