"""Scale-out over N ComfyUI backends: throughput against the ideal, and idle gaps.

Each backend is a real `comfyfleet serve --local-slots 1` process (one prompt
at a time, like ComfyUI). For N = 1, 2, 4, 8, 16 the gateway (`--local-slots
0 --backend ...`) gets 16 x N prompts of `Sleep(1)` at once (`--per-backend`).
Figures:

- efficiency: throughput / N against the ideal, i.e. ideal time (16 s) / the time
  from the first prompt's start to the last one's end, on the backends' own
  clocks (target >= 0.97);
- idle gap per backend between one prompt's end and the next one's start,
  from the backends' own history timestamps (target p50 under 5 ms);
- start spread: from the first prompt's start to the moment every backend has
  started one (how long a burst of submits takes to reach every backend).

Baseline in the same run: a naive client that round-robins the same prompts
straight onto the backends' own queues.

Each size runs `--repeat` times (default 1), fleet and naive phase each time; the
figures are the medians. Both phases' client keeps its HTTP connections open, as a
service in front of ComfyUI would (a new connection per request would load the one
gateway far more than the 16 backends the naive client spreads them over).

With `--backends URL,...` the benchmark uses servers that are already running
(e.g. real ComfyUI instances, started separately with ComfyUI's testing node
pack for `--sleep-node TestSleep`) instead of starting comfyfleet backends;
sizes then go up to the number of URLs.

With `--store postgresql://...` (a server) the gateway keeps its store in a fresh
database there.

    .venv/bin/python bench/bench_fleet.py [--sizes 1,2,4,8,16] [--per-backend 16] [--prefetch 0]
        [--repeat 1] [--backends URL,...] [--sleep-node Sleep] [--store URL]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, percentile, serve, throwaway_database

_connections = threading.local()  # per thread: one kept-alive connection per server


def call(url: str, body: Any = None) -> Any:
    """GET (or POST `body` as JSON) on a kept-alive connection; the JSON answer."""
    parts = urllib.parse.urlsplit(url)
    pool: dict[str, http.client.HTTPConnection] = _connections.__dict__.setdefault("pool", {})
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    reused = parts.netloc in pool
    conn = pool.pop(parts.netloc, None) or http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        conn.request(
            "GET" if data is None else "POST",
            path,
            body=data,
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        raw = response.read()
    except (http.client.HTTPException, OSError):
        conn.close()
        if reused:  # kept from a server that has gone since (its port was reused)
            return call(url, body)
        raise
    pool[parts.netloc] = conn
    if response.status >= 400:
        raise OSError(f"{url}: HTTP {response.status}: {raw[:200]!r}")
    return json.loads(raw) if raw else None


def wait_up(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call(url + "/prompt")
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


SLEEP_NODE = "Sleep"  # the class that sleeps 1 s (`--sleep-node`)
# Colours differ per run too, so a long-running backend's cache never skips the sleep.
COLOR_BASE = random.randrange(1 << 23)


def sleep_prompt(color: int, seconds: float = 1.0) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": COLOR_BASE + color},
        },
        "2": {"class_type": SLEEP_NODE, "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def up_count(url: str) -> int:
    return sum(b["state"] == "up" for b in call(url + "/api/fleet/backends")["backends"])


def submit(url: str, prompt: dict[str, Any]) -> str:
    prompt_id: str = call(url + "/prompt", {"prompt": prompt})["prompt_id"]
    return prompt_id


def wait_done(url: str, ids: list[str], timeout: float) -> None:
    """Until none of this server's prompts is pending or running (its queue is empty).

    It asks `/prompt` (a count), not `/queue`: a gateway answers `/queue` with every
    pending prompt, and asking for that 20 times a second would load the process
    whose hand-overs are being measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if call(url + "/prompt")["exec_info"]["queue_remaining"] == 0:
            history = call(url + "/history")
            if all(i in history for i in ids):
                return
        time.sleep(0.05)
    raise TimeoutError("prompts did not finish")


def spans(backend_urls: list[str], ids: set[str]) -> dict[str, list[tuple[int, int]]]:
    """Per backend, (start, end) in ms of each of `ids` it ran, from its own history."""
    found: dict[str, list[tuple[int, int]]] = {}
    for url in backend_urls:
        runs = []
        for prompt_id, entry in call(url + "/history").items():
            if prompt_id in ids:
                stamps = {event: data["timestamp"] for event, data in entry["status"]["messages"]}
                runs.append((stamps["execution_start"], stamps["execution_success"]))
        found[url] = sorted(runs)
    return found


def makespan(runs: dict[str, list[tuple[int, int]]]) -> float:
    """Seconds from the first start to the last end, over all backends."""
    starts = [r[0] for rs in runs.values() for r in rs]
    ends = [r[1] for rs in runs.values() for r in rs]
    return (max(ends) - min(starts)) / 1000


def start_spread(runs: dict[str, list[tuple[int, int]]]) -> float:
    """Milliseconds from the first start to the last backend's first start."""
    firsts = [rs[0][0] for rs in runs.values() if rs]
    return float(max(firsts) - min(firsts))


def gaps(runs: dict[str, list[tuple[int, int]]]) -> list[float]:
    """Per backend: the next start minus the previous end (ms)."""
    return [nxt[0] - prev[1] for rs in runs.values() for prev, nxt in itertools.pairwise(rs)]


def warm_up(gateway_url: str, backend_urls: list[str]) -> None:
    """One short prompt on each backend, then one per backend through the gateway: both
    measured phases start with code loaded and connections open (a process's first
    prompt pays for lazy imports, which would count against whichever phase ran first)."""
    for i, url in enumerate(backend_urls):
        wait_done(url, [submit(url, sleep_prompt(1_000_000 + i, seconds=0.01))], timeout=30)
    ids = [
        submit(gateway_url, sleep_prompt(2_000_000 + i, seconds=0.01))
        for i in range(len(backend_urls))
    ]
    wait_done(gateway_url, ids, timeout=30)


def run_size(
    n: int, per_backend: int, prefetch: int, root: Path, external: list[str], store: str
) -> dict[str, float]:
    ports = [free_port() for _ in range(n + 1)]
    urls = external[:n] or [f"http://127.0.0.1:{p}" for p in ports[1:]]
    procs = (
        []
        if external
        else [serve(root / f"b{p}", p, "--testing-nodes", "--local-slots", "1") for p in ports[1:]]
    )
    try:
        for url in urls:
            wait_up(url)
        gateway_url = f"http://127.0.0.1:{ports[0]}"
        config = root / "gateway.toml"
        config.write_text(
            "".join(f'[[backends]]\nurl = "{url}"\nprefetch = {prefetch}\n' for url in urls)
        )
        procs.append(
            serve(
                root / "gw",
                ports[0],
                "--testing-nodes",
                "--local-slots",
                "0",
                "--config",
                str(config),
                *(("--store", store) if store else ()),
            )
        )
        wait_up(gateway_url)
        deadline = time.monotonic() + 30
        while up_count(gateway_url) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("backends did not come up")
            time.sleep(0.05)
        warm_up(gateway_url, urls)
        count = per_backend * n
        with ThreadPoolExecutor(16) as pool:  # all at once, as many clients would
            ids = list(pool.map(lambda i: submit(gateway_url, sleep_prompt(i)), range(count)))
        wait_done(gateway_url, ids, timeout=per_backend * 10 + 30)
        runs = spans(urls, set(ids))
        fleet_gaps = gaps(runs)
        naive_runs = naive(urls, count)
        naive_gaps = gaps(naive_runs)
        return {
            "wall": makespan(runs),
            "gap50": percentile(fleet_gaps, 0.5),
            "gap99": percentile(fleet_gaps, 0.99),
            "spread": start_spread(runs),
            "naive_wall": makespan(naive_runs),
            "naive_gap50": percentile(naive_gaps, 0.5),
            "naive_spread": start_spread(naive_runs),
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def naive(urls: list[str], count: int) -> dict[str, list[tuple[int, int]]]:
    """The same prompts round-robined straight onto the backends' queues."""
    placed: dict[str, list[str]] = {url: [] for url in urls}

    def place(i: int) -> None:
        url = urls[i % len(urls)]
        body = {"prompt": sleep_prompt(10_000 + i), "prompt_id": str(uuid.uuid4())}
        placed[url].append(call(url + "/prompt", body)["prompt_id"])

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(place, range(count)))
    for url, ids in placed.items():
        wait_done(url, ids, timeout=count * 10 + 30)
    return spans(urls, {i for ids in placed.values() for i in ids})


def median_run(
    n: int, per_backend: int, prefetch: int, external: list[str], repeat: int, store: str
) -> dict[str, float]:
    """Each figure's median over `repeat` runs of one size (with `store`, a PostgreSQL
    server: the gateway's store in a fresh database there each run)."""
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
            url = stack.enter_context(throwaway_database(store)) if store else ""
            runs.append(run_size(n, per_backend, prefetch, Path(tmp), external, url))
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--per-backend", type=int, default=16, help="prompts per backend")
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per size (medians)")
    parser.add_argument("--backends", default="", help="running servers to use, comma-separated")
    parser.add_argument("--sleep-node", default="Sleep", help="the node class that sleeps")
    parser.add_argument("--store", default="", help="a PostgreSQL server for the gateway's store")
    options = parser.parse_args()
    global SLEEP_NODE
    SLEEP_NODE = options.sleep_node
    external = [url for url in options.backends.split(",") if url]
    ideal = float(options.per_backend)
    print(
        f"Sleep(1) prompts, {options.per_backend} per backend, prefetch {options.prefetch}, "
        f"medians of {options.repeat} runs"
    )
    print("   N   wall s  efficiency  gap p50 ms  gap p99 ms  spread ms |", end="")
    print(" naive wall s  naive eff.  naive gap p50  naive spread")
    for n in (int(s) for s in options.sizes.split(",")):
        fig = median_run(
            n, options.per_backend, options.prefetch, external, options.repeat, options.store
        )
        print(
            f"{n:4d}  {fig['wall']:7.2f}  {ideal / fig['wall']:10.3f}  {fig['gap50']:10.1f}  "
            f"{fig['gap99']:10.1f}  {fig['spread']:9.0f} | {fig['naive_wall']:12.2f}  "
            f"{ideal / fig['naive_wall']:10.3f}  {fig['naive_gap50']:13.1f}  "
            f"{fig['naive_spread']:12.0f}"
        )
        # Baseline: the naive round-robin client on the same backends.
        eff, naive_eff = ideal / fig["wall"], ideal / fig["naive_wall"]
        figure(f"n{n}_efficiency", eff, "x", naive_eff)
        figure(f"n{n}_gap_p50", fig["gap50"], "ms", fig["naive_gap50"])
        figure(f"n{n}_gap_p99", fig["gap99"], "ms")
        figure(f"n{n}_start_spread", fig["spread"], "ms", fig["naive_spread"])


if __name__ == "__main__":
    main()
