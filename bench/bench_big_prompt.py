"""One 10,000-node prompt against a gateway: the longest wait of its other clients, the
event log it writes, the memory it takes; and the same after a SIGKILL mid-run.

A `comfyfleet serve` process (built-in engine, no client connected to the prompt) runs
one prompt of N nodes, either wide (N/2 PrimitiveInt -> N/2 PreviewAny) or a chain
(PrimitiveInt -> ... -> PreviewAny). A client polls `GET /prompt` every 50 ms from
before the submit to the prompt's end: its longest and p99 answer times are the event
loop's stalls as clients see them. The event log's size is the bytes the store holds
for the prompt's events (JSON and binary frames), per node of the prompt; RSS growth is
the server's peak resident memory over its idle size before the submit.

With `--kill`, the server is SIGKILLed once the prompt is under way and started again
on the same store: the figures are the second process's (it runs the prompt again from
the durable queue).

Baseline, in the same run: the same client against the idle server (no prompt), the
floor of `GET /prompt` on this machine.

    .venv/bin/python bench/bench_big_prompt.py [--nodes N] [--store URL] [--kill]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, percentile, serve, throwaway_database, wait_ready

POLL_EVERY = 0.05


def wide(nodes: int) -> dict[str, Any]:
    prompt: dict[str, Any] = {}
    for k in range(nodes // 2):
        prompt[f"p{k}"] = {"class_type": "PrimitiveInt", "inputs": {"value": k}}
        prompt[f"v{k}"] = {"class_type": "PreviewAny", "inputs": {"source": [f"p{k}", 0]}}
    return prompt


def chain(nodes: int) -> dict[str, Any]:
    prompt: dict[str, Any] = {"p0": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}}
    for k in range(1, nodes - 1):
        prompt[f"p{k}"] = {"class_type": "PrimitiveInt", "inputs": {"value": [f"p{k - 1}", 0]}}
    prompt["out"] = {"class_type": "PreviewAny", "inputs": {"source": [f"p{nodes - 2}", 0]}}
    return prompt


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Poller:
    """`GET /prompt` every POLL_EVERY seconds; the answer times and the server's RSS."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.waits: list[float] = []
        self.peak_rss = 0.0
        self.pid = 0
        self.since = 0.0  # waits asked before this are not counted
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            asked = time.perf_counter()
            try:
                async with self.session.get(self.url + "/prompt") as response:
                    await response.read()
                if asked >= self.since:
                    self.waits.append(time.perf_counter() - asked)
            except aiohttp.ClientError:
                pass  # the server was killed: the next one answers
            self.peak_rss = max(self.peak_rss, rss_mib(self.pid))
            await asyncio.sleep(POLL_EVERY)

    def stop(self) -> None:
        self._stop.set()


async def ended(session: aiohttp.ClientSession, url: str, prompt_id: str) -> str:
    """Wait for the prompt's history entry; its status."""
    while True:
        try:
            async with session.get(f"{url}/history/{prompt_id}") as response:
                entry = (await response.json()).get(prompt_id)
            if entry:
                return str(entry["status"]["status_str"])
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)


async def log_bytes(data: Path, store: str | None, prompt_id: str) -> int:
    """The bytes of the prompt's events the store holds."""
    query = (
        "SELECT COALESCE(SUM(LENGTH(data)), 0) + COALESCE(SUM(LENGTH(frame)), 0) "
        "FROM event_log WHERE prompt_id = "
    )
    if store is None:
        with sqlite3.connect(data / "comfyfleet.db") as conn:
            return int(conn.execute(query + "?", (prompt_id,)).fetchone()[0])
    import asyncpg  # only the PostgreSQL runs need it

    connection = await asyncpg.connect(store)
    try:
        return int(await connection.fetchval(query + "$1", prompt_id))
    finally:
        await connection.close()


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.terminate()
        server.wait()


async def one_run(shape: str, nodes: int, store: str | None, kill: bool) -> dict[str, float]:
    prompt = wide(nodes) if shape == "wide" else chain(nodes)
    with ExitStack() as stack:
        data = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port = free_port()
        extra = ["--local-slots", "8", *(["--store", store] if store else [])]
        server = serve(data, port, *extra)
        stack.callback(stop, server)
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        async with aiohttp.ClientSession() as session:
            idle = Poller(session, url)
            idle.pid = server.pid
            idling = asyncio.create_task(idle.run())
            await asyncio.sleep(2.0)
            idle.stop()
            await idling
            base_rss = rss_mib(server.pid)
            poller = Poller(session, url)
            poller.pid = server.pid
            polling = asyncio.create_task(poller.run())
            started = time.perf_counter()
            async with session.post(url + "/prompt", json={"prompt": prompt}) as response:
                assert response.status == 200, await response.text()
                prompt_id = (await response.json())["prompt_id"]
            if kill:
                await asyncio.sleep(1.0)
                server.send_signal(signal.SIGKILL)
                server.wait()
                server = serve(data, port, *extra)
                await wait_ready(url)  # from here on: the waits of the new process
                poller.pid, poller.peak_rss, poller.since = server.pid, 0.0, time.perf_counter()
            status = await ended(session, url, prompt_id)
            took = time.perf_counter() - started
            poller.stop()
            await polling
        size = await log_bytes(data, store, prompt_id)
    waits = poller.waits
    return {
        "status_ok": float(status == "success"),
        "seconds": took,
        "longest_ms": max(waits) * 1e3,
        "p99_ms": percentile(waits, 0.99) * 1e3,
        "idle_p99_ms": percentile(idle.waits, 0.99) * 1e3,
        "log_bytes_per_node": size / nodes,
        "rss_growth_mib": max(poller.peak_rss - base_rss, 0.0),
    }


def main(nodes: int, store: str | None, kill: bool) -> None:
    where = "PostgreSQL" if store else "SQLite"
    tag = ("pg_" if store else "") + ("kill_" if kill else "")
    for shape in ("wide", "chain"):
        with ExitStack() as stack:
            url = stack.enter_context(throwaway_database(store)) if store else None
            found = asyncio.run(one_run(shape, nodes, url, kill))
        print(
            f"{nodes}-node {shape} prompt, {where}{', SIGKILL mid-run' if kill else ''}: "
            f"{'ok' if found['status_ok'] else 'FAILED'} in {found['seconds']:.1f} s; "
            f"GET /prompt longest {found['longest_ms']:.0f} ms, p99 {found['p99_ms']:.0f} ms "
            f"(idle p99 {found['idle_p99_ms']:.1f} ms); event log "
            f"{found['log_bytes_per_node']:.0f} B/node; RSS +{found['rss_growth_mib']:.0f} MiB"
        )
        name = f"{tag}{shape}{nodes}"
        figure(f"{name}_completed", found["status_ok"], "count")
        figure(f"{name}_seconds", found["seconds"], "s")
        figure(f"{name}_longest_wait", found["longest_ms"], "ms", found["idle_p99_ms"])
        figure(f"{name}_p99_wait", found["p99_ms"], "ms", found["idle_p99_ms"])
        figure(f"{name}_log_per_node", found["log_bytes_per_node"], "B")
        figure(f"{name}_rss_growth", found["rss_growth_mib"], "MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--store", help="a PostgreSQL server URL (a throwaway database on it)")
    parser.add_argument("--kill", action="store_true", help="SIGKILL the server mid-run")
    options = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(options.nodes, options.store, options.kill)
