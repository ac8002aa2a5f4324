"""Several gateways on one PostgreSQL store: throughput, and how long a failover takes.

Throughput: trivial prompts (EmptyImage 64x64 -> ImageInvert -> SaveImage, distinct
colours) through 1, 2 and 3 `comfyfleet serve` processes sharing a fresh PostgreSQL
database (`--local-slots 8` each), submitted round-robin over HTTP with `--in-flight`
prompts outstanding; a prompt counts done when its `executing {node: null}` arrives
(the client holds a WebSocket on every gateway under one client id, since a prompt's
frames come from the gateway that runs it). Baseline in the same run: one gateway on
its SQLite store, same client, same prompts.

Failover: two gateways on PostgreSQL with `--lease L`; a Sleep(60) prompt starts on
one, which is then SIGKILLed; the figure is the time from the kill to the prompt's
start on the other (its second attempt), read from the jobs API every 20 ms. Taken
at the default lease (10 s) and at 2 s.

Frames across gateways: two gateways on PostgreSQL, A without slots and B with 8; one
client holds a WebSocket on each under one client id, and trivial prompts are submitted
to B (`--in-flight` at most 4 outstanding). For each prompt, the time from its submit to
its first frame (`execution_start`) and to its done signal on A's socket (relayed from
the event log on the store's NOTIFY) against B's (sent by the gateway that runs it), same
prompts, same run: p50 and p99.

All gateways run on this machine: on 2 vCPUs, three gateways share the CPUs that one
had, so their sum shows what the shared store costs, not what more machines gain.

    .venv/bin/python bench/bench_gateways.py [--prompts N] [--in-flight K] [--store URL]
        [--only crossing]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import trivial_prompt
from figures import figure
from harness import free_port, mark_done, percentile, serve, throwaway_database, wait_ready

DEFAULT_STORE = "postgresql://postgres@127.0.0.1:5432/postgres"


async def through(urls: list[str], count: int, in_flight: int, offset: int) -> dict[str, float]:
    """Submit round-robin over `urls`; each prompt done at its done signal, wherever."""
    client_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        for url in urls:
            await wait_ready(url)
        sockets = [await session.ws_connect(f"{url}/ws?clientId={client_id}") for url in urls]
        done: dict[str, asyncio.Future[float]] = {}

        readers = [asyncio.create_task(mark_done(ws, done)) for ws in sockets]
        gate = asyncio.Semaphore(in_flight)
        latencies: list[float] = []
        targets = itertools.cycle(urls)

        async def one(color: int) -> None:
            async with gate:
                prompt_id = str(uuid.uuid4())
                done[prompt_id] = asyncio.get_running_loop().create_future()
                body = {"prompt": trivial_prompt(color), "client_id": client_id}
                body["prompt_id"] = prompt_id
                sent = time.perf_counter()
                async with session.post(next(targets) + "/prompt", json=body) as response:
                    assert response.status == 200, await response.text()
                latencies.append(await done[prompt_id] - sent)

        start = time.perf_counter()
        await asyncio.gather(*(one(offset + i) for i in range(count)))
        elapsed = time.perf_counter() - start
        for task in readers:
            task.cancel()
        for ws in sockets:
            await ws.close()
    return {"rate": count / elapsed, "p50": percentile(latencies, 0.5)}


def gateways(stack: ExitStack, root: Path, count: int, *extra: str) -> list[str]:
    urls = []
    for n in range(count):
        port = free_port()
        proc = serve(root / f"gw{n}", port, "--local-slots", "8", *extra)
        stack.callback(_stop, proc)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def measure(count: int, in_flight: int, how_many: int, store: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        extra = () if store is None else ("--store", store)
        urls = gateways(stack, Path(tmp), how_many, *extra)
        asyncio.run(through(urls, 30, in_flight, 10_000_000))  # warm-up
        return asyncio.run(through(urls, count, in_flight, 0))


async def _job(session: aiohttp.ClientSession, url: str, prompt_id: str) -> dict[str, Any]:
    async with session.get(f"{url}/api/jobs/{prompt_id}") as response:
        found: dict[str, Any] = await response.json()
        return found


async def _failover(urls: list[str], procs: dict[str, subprocess.Popen[bytes]]) -> float:
    sleep = {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": 60.0}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }
    async with aiohttp.ClientSession() as session:
        for url in urls:
            await wait_ready(url)
        async with session.post(urls[0] + "/prompt", json={"prompt": sleep}) as response:
            prompt_id = (await response.json())["prompt_id"]
        while (job := await _job(session, urls[0], prompt_id))["status"] != "in_progress":
            await asyncio.sleep(0.02)
        port = job["gateway"].removeprefix("gw-")
        runner = next(url for url in urls if url.endswith(f":{port}"))
        survivor = next(url for url in urls if url != runner)
        procs[runner].send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        while (await _job(session, survivor, prompt_id))["attempt"] < 2:
            await asyncio.sleep(0.02)
        return time.perf_counter() - killed


def failover(store: str, lease: float) -> float:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for n in range(2):
            port = free_port()
            # The gateway id names the port, so the one running the prompt is found by it.
            flags = ["--store", store, "--lease", f"{lease}s", "--gateway-id", f"gw-{port}"]
            flags += ["--shutdown-grace", "0"]  # the re-run prompt is not waited for
            proc = serve(Path(tmp) / f"gw{n}", port, "--testing-nodes", *flags)
            stack.callback(_stop, proc)
            procs[f"http://127.0.0.1:{port}"] = proc
        return asyncio.run(_failover(list(procs), procs))


async def _arrivals(
    ws: aiohttp.ClientWebSocketResponse, seen: dict[tuple[str, str], float]
) -> None:
    """When each prompt's first frame ("first") and done signal ("done") came."""
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            continue
        frame = json.loads(message.data)
        data = frame["data"]
        if frame["type"] == "execution_start":
            seen.setdefault((data["prompt_id"], "first"), time.perf_counter())
        elif frame["type"] == "executing" and data.get("node") is None:
            seen.setdefault((data["prompt_id"], "done"), time.perf_counter())


async def _crossing(relaying: str, running: str, count: int, in_flight: int) -> dict[str, float]:
    client_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        for url in (relaying, running):
            await wait_ready(url)
        arrived: dict[str, dict[tuple[str, str], float]] = {"a": {}, "b": {}}
        sockets = {
            side: await session.ws_connect(f"{url}/ws?clientId={client_id}")
            for side, url in (("a", relaying), ("b", running))
        }
        readers = [asyncio.create_task(_arrivals(sockets[s], arrived[s])) for s in sockets]
        gate = asyncio.Semaphore(in_flight)
        sent: dict[str, float] = {}

        async def one(color: int) -> None:
            async with gate:
                prompt_id = str(uuid.uuid4())
                body = {"prompt": trivial_prompt(color), "client_id": client_id}
                body["prompt_id"] = prompt_id
                sent[prompt_id] = time.perf_counter()
                async with session.post(running + "/prompt", json=body) as response:
                    assert response.status == 200, await response.text()
                while not all((prompt_id, "done") in seen for seen in arrived.values()):
                    await asyncio.sleep(0.002)

        await asyncio.gather(*(one(i) for i in range(count)))
        for task in readers:
            task.cancel()
        for ws in sockets.values():
            await ws.close()
    figures = {}
    for side in ("a", "b"):
        for kind in ("first", "done"):
            times = [arrived[side][(p, kind)] - at for p, at in sent.items()]
            figures[f"{side}_{kind}_p50"] = percentile(times, 0.5)
            figures[f"{side}_{kind}_p99"] = percentile(times, 0.99)
    return figures


def crossing(store: str, count: int, in_flight: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        urls = []
        for n, slots in enumerate(("0", "8")):
            port = free_port()
            proc = serve(Path(tmp) / f"gw{n}", port, "--local-slots", slots, "--store", store)
            stack.callback(_stop, proc)
            urls.append(f"http://127.0.0.1:{port}")
        asyncio.run(_crossing(urls[0], urls[1], 30, in_flight))  # warm-up
        return asyncio.run(_crossing(urls[0], urls[1], count, in_flight))


def report_crossing(store: str, count: int, in_flight: int) -> None:
    with throwaway_database(store) as url:
        got = crossing(url, count, min(in_flight, 4))
    print(f"  frames across gateways ({count} prompts): submit -> frame, relayed vs sent")
    for kind, label in (("first", "first frame"), ("done", "done signal")):
        for q in ("p50", "p99"):
            relayed, direct = got[f"a_{kind}_{q}"], got[f"b_{kind}_{q}"]
            print(
                f"    {label} {q}: other gateway {relayed * 1e3:6.1f} ms, "
                f"running gateway {direct * 1e3:6.1f} ms"
            )
            figure(f"crossing_{kind}_{q}", relayed * 1e3, "ms", direct * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--store", default=DEFAULT_STORE, help="a PostgreSQL server URL")
    parser.add_argument("--only", choices=["crossing"], help="run only this measurement")
    options = parser.parse_args()
    if options.only == "crossing":
        report_crossing(options.store, options.prompts, options.in_flight)
        return
    print(f"{options.prompts} trivial prompts, {options.in_flight} in flight, 8 slots a gateway")
    base = measure(options.prompts, options.in_flight, 1, None)
    print(
        f"  baseline: 1 gateway, SQLite      {base['rate']:7.1f} prompts/s   "
        f"submit -> done p50 {base['p50'] * 1e3:6.1f} ms"
    )
    for count in (1, 2, 3):
        with throwaway_database(options.store) as url:
            got = measure(options.prompts, options.in_flight, count, url)
        print(
            f"  {count} gateway(s), PostgreSQL     {got['rate']:7.1f} prompts/s "
            f"({got['rate'] / base['rate']:4.2f}x)   submit -> done p50 {got['p50'] * 1e3:6.1f} ms"
        )
        figure(f"gateways{count}_postgres_throughput", got["rate"], "prompts/s", base["rate"])
        figure(
            f"gateways{count}_postgres_submit_done_p50", got["p50"] * 1e3, "ms", base["p50"] * 1e3
        )
    report_crossing(options.store, options.prompts, options.in_flight)
    for lease in (10.0, 2.0):
        with throwaway_database(options.store) as url:
            seconds = failover(url, lease)
        print(f"  failover, lease {lease:g} s: SIGKILL to the prompt restarted {seconds:6.2f} s")
        figure(f"failover_lease{lease:g}s", seconds, "s", lease)


if __name__ == "__main__":
    main()
