"""One gateway in front of up to 1,000 simulated ComfyUI backends: how long until all are
up, how well it keeps them busy, and what each dispatch costs it in CPU.

The backends are simulated ComfyUI 0.3.64 processes (bench/comfyui_sim.py: one slot,
ComfyUI's routes, frames and history), all N of them served by ONE simulator process
on loopback ports. The gateway is one `comfyfleet serve --local-slots 0` process whose
`--config` TOML lists the N backends (`[[backends]]` url, name, prefetch). For each N
in `--sizes`:

- all_up_seconds: from the gateway's start until `GET /api/fleet/backends` shows all
  N backends `up` (polled 2 to 10 times a second);
- then `--per-backend` x N prompts of one `Sleep(--seconds)` -> PreviewAny go in at
  once (64 connections), after one warm-up prompt; the client waits for them by
  polling `GET /prompt` twice a second, then reads `/history` once;
- efficiency: the ideal time (per-backend x seconds) / the time from the first
  prompt's start to the last one's end, on the simulator's clock (`GET /sim/runs` of
  each backend);
- idle gap p50 / p99 (ms): per backend, from one prompt's end to the next one's start;
- start spread (ms): from the first prompt's start until every backend has started one;
- cpu_per_dispatch_ms: the gateway process's CPU time (utime + stime, /proc/PID/stat)
  from just before the submits until all prompts are in its history, per prompt; the
  simulator's the same way, for context (sim_cpu_per_dispatch_ms).

Baselines in the same run: efficiency against the ideal (1.0); the CPU figures of each
size against those of the first size (16 backends by default), so the ratio shows how
the cost of one dispatch grows with the fleet; completed against the prompts sent.

The machine's cores are shared by the simulator, the gateway and this client.

With `--store postgresql://...` (a server) the gateway keeps its store in a fresh
database there; `--prefetch N` sets each backend's prefetch. With `--log-dir DIR` the
gateway runs at `--log-level INFO` and its stderr (and the simulator's) goes to
DIR/gateway-nN.log (DIR/sim-nN.log); its warnings and errors are summed up.

    .venv/bin/python bench/bench_fleet_scale.py [--sizes 16,100,300,1000] [--seconds 10]
        [--per-backend 2] [--prefetch 0] [--store URL] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import math
import os
import re
import signal
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
from harness import BIN, free_port, percentile, serve, throwaway_database

SIMULATOR = Path(__file__).resolve().with_name("comfyui_sim.py")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
#: Connections the client submits over (as many clients would).
SUBMIT_CONNECTIONS = 64
DONE_POLL = 0.5  # seconds between `GET /prompt` while the prompts run


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sleep_prompt(seconds: float) -> dict[str, Any]:
    return {
        "1": {"class_type": "Sleep", "inputs": {"seconds": seconds}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float = 60.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        response.raise_for_status()
        return await response.json()


async def wait_ready_file(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> list[str]:
    """The simulator's backend urls, once it has listed them."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the simulator exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("the simulator did not start")
        await asyncio.sleep(0.1)
    return [line for line in path.read_text().splitlines() if line]


async def wait_gateway(session: aiohttp.ClientSession, url: str, proc: Any) -> None:
    """Until the gateway answers `GET /prompt`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}")
        try:
            async with session.get(url + "/prompt") as response:
                if response.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError("the gateway did not start")


async def wait_all_up(
    session: aiohttp.ClientSession, url: str, n: int, started: float, timeout: float
) -> tuple[float, collections.Counter[str]]:
    """Seconds from `started` until all `n` backends are up (NaN if not within `timeout`),
    and the last count of their states."""
    every = max(0.1, min(0.5, n / 2000))  # the answer grows with n: ask it less often
    states: collections.Counter[str] = collections.Counter()
    while time.monotonic() - started < timeout:
        try:
            answer = await get_json(session, url + "/api/fleet/backends")
            states = collections.Counter(b["state"] for b in answer["backends"])
            if states["up"] >= n:
                return time.monotonic() - started, states
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(every)
    return math.nan, states


async def submit_all(url: str, prompt: dict[str, Any], count: int) -> list[str]:
    """`count` submits at once over SUBMIT_CONNECTIONS connections; the prompt ids."""
    connector = aiohttp.TCPConnector(limit=SUBMIT_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> str:
            async with session.post(url + "/prompt", json={"prompt": prompt}) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"POST /prompt: HTTP {response.status}: {answer}")
                return str(answer["prompt_id"])

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def wait_finished(
    session: aiohttp.ClientSession, url: str, ids: list[str], timeout: float
) -> dict[str, str]:
    """Until every prompt of `ids` has a history entry on the gateway (or `timeout`); the
    status of each that has one. Polls `GET /prompt` (a count): the gateway is being
    measured, so the full history is read only once its queue is empty."""
    wanted = set(ids)
    deadline = time.monotonic() + timeout
    found: dict[str, str] = {}
    while True:
        remaining = (await get_json(session, url + "/prompt"))["exec_info"]["queue_remaining"]
        if remaining == 0 or time.monotonic() > deadline:
            history = await get_json(session, f"{url}/history?max_items={len(ids) + 100}")
            found = {
                prompt_id: entry["status"]["status_str"]
                for prompt_id, entry in history.items()
                if prompt_id in wanted
            }
            if len(found) == len(wanted) or time.monotonic() > deadline:
                return found
        await asyncio.sleep(DONE_POLL)


async def sim_runs(urls: list[str], ids: set[str]) -> dict[str, list[tuple[float, float, float]]]:
    """Per backend, (start, end, arrived) of each of `ids` it ran, from its `/sim/runs`
    (arrived: when the gateway's submit reached it)."""
    connector = aiohttp.TCPConnector(limit=SUBMIT_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def of(url: str) -> list[tuple[float, float, float]]:
            runs = await get_json(session, url + "/sim/runs")
            return sorted(
                (r["start"], r["end"], r["arrived"]) for r in runs if r["prompt_id"] in ids
            )

        found = await asyncio.gather(*(of(url) for url in urls))
    return dict(zip(urls, found))


def gaps_ms(runs: dict[str, list[tuple[float, float, float]]]) -> list[float]:
    """Per backend: each next start minus the previous end, in ms."""
    return [
        (nxt[0] - prev[1]) * 1000
        for backend in runs.values()
        for prev, nxt in itertools.pairwise(backend)
    ]


def handovers_ms(runs: dict[str, list[tuple[float, float, float]]]) -> list[float]:
    """The gateway's part of each gap: from the previous end until the next prompt's
    submit reached the backend (negative: it came before the end, queued there)."""
    return [
        (nxt[2] - prev[1]) * 1000
        for backend in runs.values()
        for prev, nxt in itertools.pairwise(backend)
    ]


async def run_size(
    n: int, options: argparse.Namespace, store: str | None, root: Path
) -> dict[str, float]:
    log_dir: Path | None = options.log_dir
    sim_log = (log_dir or root) / f"sim-n{n}.log"
    gateway_log = log_dir / f"gateway-n{n}.log" if log_dir else None
    ready = root / "backends.txt"
    with ExitStack() as stack:
        sim_err = stack.enter_context(sim_log.open("wb"))
        sim = subprocess.Popen(
            [sys.executable, str(SIMULATOR), "--count", str(n), "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL,
            stderr=sim_err,
        )
        stack.callback(stop, sim)
        try:
            urls = await wait_ready_file(ready, sim, timeout=120)
        except (RuntimeError, TimeoutError):
            print(tail(sim_log), file=sys.stderr)
            raise
        config = root / "gateway.toml"
        config.write_text(
            "".join(
                f'[[backends]]\nurl = "{url}"\nname = "sim{i}"\nprefetch = {options.prefetch}\n\n'
                for i, url in enumerate(urls)
            )
        )
        port = free_port()
        gateway_url = f"http://127.0.0.1:{port}"
        extra = ["--local-slots", "0", "--config", str(config)]
        extra += ["--store", store] if store else []
        started = time.monotonic()
        if gateway_log is None:
            gateway = serve(root / "gw", port, *extra)
        else:  # harness.serve, but at INFO and with its stderr kept
            log_file = stack.enter_context(gateway_log.open("wb"))
            command = [BIN, "serve", "--port", str(port), "--data-dir", str(root / "gw")]
            gateway = subprocess.Popen(
                [*command, "--log-level", "INFO", *extra],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        stack.callback(stop, gateway, 60.0)  # runs before the simulator's stop
        async with aiohttp.ClientSession() as session:
            await wait_gateway(session, gateway_url, gateway)
            answering = time.monotonic() - started
            all_up, states = await wait_all_up(session, gateway_url, n, started, options.up_timeout)
            if math.isnan(all_up):
                print(
                    f"  N={n}: not all backends up after {options.up_timeout:.0f} s: "
                    f"{dict(states)}; going on with those that are",
                    flush=True,
                )
            # One prompt first: the gateway's first dispatch loads code the others reuse.
            warm = await submit_all(gateway_url, sleep_prompt(0.0), 1)
            await wait_finished(session, gateway_url, warm, timeout=60)

            count = options.per_backend * n
            ideal = options.per_backend * options.seconds
            gateway_cpu, sim_cpu = cpu_seconds(gateway.pid), cpu_seconds(sim.pid)
            submitting = time.monotonic()
            ids = await submit_all(gateway_url, sleep_prompt(options.seconds), count)
            submitted = time.monotonic() - submitting
            statuses = await wait_finished(
                session, gateway_url, ids, timeout=ideal * 5 + options.up_timeout
            )
            took = time.monotonic() - submitting
            gateway_cpu = cpu_seconds(gateway.pid) - gateway_cpu
            sim_cpu = cpu_seconds(sim.pid) - sim_cpu
        runs = await sim_runs(urls, set(ids))
        log_end = gateway_log.stat().st_size if gateway_log else 0  # what follows: shutdown
    # Both processes have ended here (the ExitStack stopped them).
    starts = [r[0] for rs in runs.values() for r in rs]
    ends = [r[1] for rs in runs.values() for r in rs]
    firsts = [rs[0][0] for rs in runs.values() if rs]
    gaps = gaps_ms(runs)
    makespan = max(ends) - min(starts) if starts else math.nan
    warnings = summarize_log(gateway_log, log_end) if gateway_log else None
    return {
        "n": n,
        "count": count,
        "answering": answering,
        "all_up": all_up,
        "up": states["up"],
        "submitted": submitted,
        "took": took,
        "completed": sum(s == "success" for s in statuses.values()),
        "in_history": len(statuses),
        "ran": len(starts),
        "backends_used": sum(bool(rs) for rs in runs.values()),
        "makespan": makespan,
        "efficiency": ideal / makespan,
        "gap50": percentile(gaps, 0.5),
        "gap99": percentile(gaps, 0.99),
        "gap_max": max(gaps, default=math.nan),
        "handover50": percentile(handovers_ms(runs), 0.5),
        "spread": (max(firsts) - min(firsts)) * 1000 if firsts else math.nan,
        "gateway_cpu": gateway_cpu,
        "sim_cpu": sim_cpu,
        "cpu_per_dispatch": gateway_cpu / count * 1000,
        "sim_cpu_per_dispatch": sim_cpu / count * 1000,
        "warnings": warnings,
    }


LEVEL = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def summarize_log(path: Path, end: int) -> dict[str, Any]:
    """The warnings and errors of the gateway's log up to byte `end` (the run; after it
    come those of its shutdown, counted apart): counts, and the most frequent messages
    (prompt ids and numbers folded, so one kind of message counts once)."""
    kinds: collections.Counter[str] = collections.Counter()
    levels: collections.Counter[str] = collections.Counter()
    first: dict[str, str] = {}
    raw = path.read_bytes()
    for line in raw[:end].decode(errors="replace").splitlines():
        match = LEVEL.match(line)
        if match is None:
            continue
        level, logger, message = match.groups()
        levels[level] += 1
        folded = re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", message)
        kind = f"{level} {logger}: " + re.sub(r"\d+(\.\d+)?", "#", folded)[:160]
        kinds[kind] += 1
        first.setdefault(kind, line[:300])
    at_shutdown = sum(
        LEVEL.match(line) is not None for line in raw[end:].decode(errors="replace").splitlines()
    )
    return {
        "levels": dict(levels),
        "top": [(k, c, first[k]) for k, c in kinds.most_common(8)],
        "at_shutdown": at_shutdown,
    }


def report(found: dict[str, Any], options: argparse.Namespace, base: dict[str, Any]) -> None:
    n = found["n"]
    print(
        f"N={n:4d}: gateway answering after {found['answering']:.1f} s, all {n} up after "
        f"{found['all_up']:.1f} s ({found['up']} up); {found['count']} prompts of "
        f"{options.seconds:g} s submitted in {found['submitted']:.1f} s, all in history "
        f"after {found['took']:.1f} s ({found['completed']} succeeded, "
        f"{found['in_history']} in history, {found['ran']} ran on "
        f"{found['backends_used']} backends)",
        flush=True,
    )
    gateway_share = found["gateway_cpu"] / found["took"] * 100
    sim_share = found["sim_cpu"] / found["took"] * 100
    ideal = options.per_backend * options.seconds
    print(
        f"        makespan {found['makespan']:.2f} s (ideal {ideal:g} s), efficiency "
        f"{found['efficiency']:.3f}; idle gap p50 {found['gap50']:.1f} ms, "
        f"p99 {found['gap99']:.1f} ms, max {found['gap_max']:.1f} ms (p50 from an end "
        f"until the next submit came {found['handover50']:.1f} ms); start spread "
        f"{found['spread']:.0f} ms",
        flush=True,
    )
    print(
        f"        gateway CPU {found['gateway_cpu']:.1f} s ({gateway_share:.0f}% of a core), "
        f"{found['cpu_per_dispatch']:.2f} ms per prompt; simulator CPU {found['sim_cpu']:.1f} s "
        f"({sim_share:.0f}% of a core), {found['sim_cpu_per_dispatch']:.2f} ms per prompt",
        flush=True,
    )
    warnings = found["warnings"]
    if warnings is not None:
        print(
            f"        gateway log during the run: {warnings['levels'] or 'no warnings or errors'}"
            f" (and {warnings['at_shutdown']} warnings or errors as it shut down)",
            flush=True,
        )
        for _kind, count, line in warnings["top"]:
            print(f"          {count:5d} x {line}", flush=True)
    name = f"n{n}"
    later = base.get("n") != n  # the first size is the baseline of the others
    figure(f"{name}_efficiency", found["efficiency"], "x", 1.0)
    figure(f"{name}_idle_gap_p50", found["gap50"], "ms")
    figure(f"{name}_idle_gap_p99", found["gap99"], "ms")
    figure(f"{name}_start_spread", found["spread"], "ms")
    figure(f"{name}_all_up_seconds", found["all_up"], "s")
    figure(
        f"{name}_cpu_per_dispatch_ms",
        found["cpu_per_dispatch"],
        "ms",
        base["cpu_per_dispatch"] if later else None,
    )
    figure(
        f"{name}_sim_cpu_per_dispatch_ms",
        found["sim_cpu_per_dispatch"],
        "ms",
        base["sim_cpu_per_dispatch"] if later else None,
    )
    figure(f"{name}_completed", found["completed"], "count", found["count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="16,100,300,1000", help="backend counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="each prompt's sleep")
    parser.add_argument("--per-backend", type=int, default=2, help="prompts per backend")
    parser.add_argument("--prefetch", type=int, default=0, help="each backend's prefetch")
    parser.add_argument("--store", help="a PostgreSQL server URL (a throwaway database on it)")
    parser.add_argument("--log-dir", type=Path, help="keep the gateway's INFO log here")
    parser.add_argument(
        "--up-timeout", type=float, default=300.0, help="seconds to wait for all backends up"
    )
    options = parser.parse_args()
    if options.log_dir:
        options.log_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in options.sizes.split(",") if s]
    where = "PostgreSQL" if options.store else "SQLite"
    print(
        f"{options.per_backend} prompts of Sleep({options.seconds:g} s) per backend, prefetch "
        f"{options.prefetch}, store {where}; simulated backends in one process; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    base: dict[str, Any] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
            url = stack.enter_context(throwaway_database(options.store)) if options.store else None
            found = asyncio.run(run_size(n, options, url, Path(tmp)))
        base = base or found
        report(found, options, base)


if __name__ == "__main__":
    main()
