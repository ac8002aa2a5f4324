"""History at scale: a `comfyfleet serve` data dir holding 1,000,000 finished prompts.

The store is built fast: `SQLiteStore` creates the schema, then one SQLite
transaction inserts rows shaped exactly like the store's own finish() writes
(a job, its history row, three status messages and one output file each).
Then, against a `comfyfleet serve --local-slots 1` process on that data dir:

- startup: process start until `GET /prompt` answers 200;
- `GET /history?max_items=100` latency p50/p99 (newest 100 entries);
- `GET /history/{id}` latency p50/p99 (random ids);
- the server's resident memory (VmRSS, and its peak VmHWM, from /proc/<pid>/status)
  after those requests.

Baseline, measured in the same run: the same with 1,000 entries.

    .venv/bin/python bench/bench_history.py [--entries 1000000] [--baseline 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from comfyfleet.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import BIN, free_port, percentile

PROMPT = json.dumps(
    {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "SaveImage",
            "inputs": {"images": ["2", 0], "filename_prefix": "hist"},
        },
    },
    separators=(",", ":"),
)
T0 = 1_780_000_000.0


def prompt_id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def build(path: Path, count: int, batch: int = 50_000) -> float:
    """Seconds to create a store with `count` finished prompts in its history."""
    start = time.perf_counter()

    async def create() -> None:
        store = SQLiteStore(path)
        await store.open()
        await store.close()

    asyncio.run(create())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")

    for lo in range(0, count, batch):
        hi = min(count, lo + batch)
        jobs, history, events, outputs = [], [], [], []
        for i in range(lo, hi):
            pid = prompt_id(i)
            t = T0 + i * 0.01
            extra = compact({"client_id": f"client-{i % 97}"})
            jobs.append(
                (pid, i + 1, str(i), float(i), f"client-{i % 97}", PROMPT, extra, t, t, t + 0.005)
            )
            image = {"filename": f"hist_{i:07d}_.png", "subfolder": "", "type": "output"}
            history.append((pid, compact({"3": {"images": [image]}}), t + 0.005))
            ms = int(t * 1000)
            events.append((pid, 0, "execution_start", compact({"prompt_id": pid, "timestamp": ms})))
            cached = {"nodes": [], "prompt_id": pid, "timestamp": ms}
            events.append((pid, 1, "execution_cached", compact(cached)))
            done = {"prompt_id": pid, "timestamp": ms + 5}
            events.append((pid, 2, "execution_success", compact(done)))
            outputs.append((pid, image["filename"]))
        conn.executemany(
            "INSERT INTO jobs (prompt_id, seq, number_json, order_key, front, status, client_id,"
            " prompt, extra_data, outputs, node_errors, attempt, lane, created_at, started_at,"
            " finished_at) VALUES (?, ?, ?, ?, 0, 'success', ?, ?, ?, '[\"3\"]', '{}', 1,"
            " 'local', ?, ?, ?)",
            jobs,
        )
        conn.executemany(
            "INSERT INTO history (prompt_id, status, outputs, meta, completed_at)"
            " VALUES (?, 'success', ?, '{}', ?)",
            history,
        )
        conn.executemany(
            "INSERT INTO events (prompt_id, attempt, seq, type, data) VALUES (?, 1, ?, ?, ?)",
            events,
        )
        conn.executemany(
            "INSERT INTO outputs (prompt_id, filename, subfolder, type)"
            " VALUES (?, ?, '', 'output')",
            outputs,
        )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - start


def memory_kib(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def timed_get(conn: http.client.HTTPConnection, path: str) -> tuple[float, Any]:
    start = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    assert response.status == 200, (path, response.status, body[:200])
    return elapsed * 1000, json.loads(body)


def measure(data: Path, count: int, requests: int) -> dict[str, float]:
    port = free_port()
    command = [BIN, "serve", "--port", str(port), "--data-dir", str(data)]
    command += ["--local-slots", "1", "--log-level", "WARNING"]
    start = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        deadline = start + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("GET", "/prompt")
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    break
            except OSError:
                conn.close()
            if time.perf_counter() > deadline or server.poll() is not None:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        startup = time.perf_counter() - start
        listing = []
        for _ in range(requests):
            ms, body = timed_get(conn, "/history?max_items=100")
            assert len(body) == min(100, count), len(body)
            assert prompt_id(count - 1) in body
            listing.append(ms)
        one = []
        picks = random.Random(1)
        for _ in range(requests):
            wanted = prompt_id(picks.randrange(count))
            ms, body = timed_get(conn, f"/history/{wanted}")
            assert list(body) == [wanted], list(body)[:3]
            one.append(ms)
        conn.close()
        memory = memory_kib(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {
        "startup": startup,
        "list50": percentile(listing, 0.5),
        "list99": percentile(listing, 0.99),
        "one50": percentile(one, 0.5),
        "one99": percentile(one, 0.99),
        "rss": memory["VmRSS"] / 1024,
        "hwm": memory["VmHWM"] / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    options = parser.parse_args()
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (options.baseline, options.entries):
            data = Path(tmp) / f"data-{count}"
            built = build(data / "comfyfleet.db", count)
            size = (data / "comfyfleet.db").stat().st_size / 2**20
            print(f"  built {count} entries in {built:6.1f} s ({size:,.0f} MiB database)")
            results[count] = measure(data, count, options.requests)
    print("history at scale: comfyfleet serve on a data dir with N finished prompts")
    print(f"{'N':>9} {'startup s':>10} {'list p50':>9} {'list p99':>9} {'one p50':>8} ", end="")
    print(f"{'one p99':>8} {'RSS MiB':>8} {'peak MiB':>9}")
    for count, r in results.items():
        print(
            f"{count:9d} {r['startup']:10.2f} {r['list50']:9.2f} {r['list99']:9.2f} "
            f"{r['one50']:8.2f} {r['one99']:8.2f} {r['rss']:8.1f} {r['hwm']:9.1f}"
        )
    big, base = results[options.entries], results[options.baseline]
    n = options.entries
    figure(f"entries{n}_startup", big["startup"], "s", base["startup"])
    figure(f"entries{n}_history_100_p50", big["list50"], "ms", base["list50"])
    figure(f"entries{n}_history_100_p99", big["list99"], "ms", base["list99"])
    figure(f"entries{n}_history_one_p50", big["one50"], "ms", base["one50"])
    figure(f"entries{n}_history_one_p99", big["one99"], "ms", base["one99"])
    figure(f"entries{n}_rss", big["rss"], "MiB", base["rss"])
    figure(f"entries{n}_peak_rss", big["hwm"], "MiB", base["hwm"])


if __name__ == "__main__":
    main()
