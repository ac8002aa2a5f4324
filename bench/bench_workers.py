"""Workers (`comfyfleet worker`): the cost of reaching a backend through a worker's own
connection, and a fleet of workers that come and go.

1. **Idle gap, push against workers.** N backends, each `comfyfleet serve --local-slots 1
   --testing-nodes`: once given to a gateway with `--backend URL` (the baseline: the
   gateway connects to them), once each brought by a `comfyfleet worker --local-slots 1`
   that connects out to a gateway (the gateway reaches it through that connection).
   Each gateway gets `--per-slot` x N prompts of `Sleep(1)` at once. Figures: the idle
   gap per slot (from one prompt's end to the next one's start on the same lane, from
   the gateway's history: the backends' own event times), p50 and p90, and the
   efficiency (ideal time / first start to last end).
2. **Churn.** `--churn-prompts` prompts of `LedgerAppend(seconds)` are queued, then
   `--churn-workers` workers (built-in engine, 1 slot each) start. The baseline: they
   stay until the queue is drained. Then the same again with churn: each worker lives
   a random 15 to 45 s, then is stopped, a quarter of them with SIGKILL (its backend
   dies with it), the rest with SIGTERM (they drain), and another starts in its place.
   Figures: prompts lost (not ended in success), prompts whose side effect happened
   more than once (counted outside every process: the ledger file), of those the ones
   whose first run's worker was SIGKILLed after the side effect (within a second: its
   result died with it), and the efficiency against the live slot-time (the prompts'
   seconds / the seconds the workers' lanes were up, summed; a lane counts from when
   the gateway lists it up to when its process exits, or the queue drained).

    .venv/bin/python bench/bench_workers.py [--workers 16] [--per-slot 8]
        [--churn-workers 20] [--churn-prompts 2000] [--churn-seconds 0.2] [--skip-churn]
        [--skip-gap] [--keep DIR] [--backend-hold 30]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import BIN, free_port, percentile, serve

TOKEN = "bench-worker-token-" + os.urandom(6).hex()
#: Seconds a churned worker lives: long enough on a small machine that it works for most
#: of its life (starting one takes seconds of CPU there).
LIFE = (15.0, 45.0)
LEDGER_ENV = "COMFYFLEET_TEST_LEDGER"


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return json.loads(answer.read())


def post(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.1)


def drained(gateway: str, answers: list[float] | None = None) -> bool:
    """Nothing pending or running. Asked of `GET /prompt`: `GET /queue` lists every
    prompt, and asked ten times a second of a deep queue it is a load of its own. How
    long each answer took goes to `answers` (the gateway's stalls, seen from outside)."""
    asked = time.monotonic()
    remaining: int = get(gateway + "/prompt")["exec_info"]["queue_remaining"]
    if answers is not None:
        answers.append(time.monotonic() - asked)
    return remaining == 0


def answers(url: str) -> bool:
    try:
        get(url + "/system_stats")
        return True
    except OSError:
        return False


def up_lanes(gateway: str) -> dict[str, bool]:
    return {b["name"]: b["state"] == "up" for b in get(gateway + "/api/fleet/backends")["backends"]}


def worker(gateway: str, folder: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [BIN, "worker", "--gateway", gateway, "--name", name, "--local-slots", "1"]
    command += [
        "--testing-nodes",
        "--data-dir",
        str(folder),
        "--grace",
        "5",
        "--log-level",
        "WARNING",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def gateway_config(folder: Path) -> Path:
    config = folder / "gateway.toml"
    config.write_text(f'[[worker_tokens]]\nname = "bench"\ntoken = "{TOKEN}"\n')
    return config


def sleep_prompt(seconds: float, n: int) -> dict[str, Any]:
    """A sleep no lane has a result of in its cache (each color differs)."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": n},
        },
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }


def runs_by_lane(gateway: str, ids: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Each lane's prompts as (start, end), in seconds, from the history's event times."""
    lanes: dict[str, list[tuple[float, float]]] = {}
    for prompt_id in ids:
        entry = get(f"{gateway}/history/{prompt_id}")[prompt_id]
        times = {name: data["timestamp"] / 1000 for name, data in entry["status"]["messages"]}
        lane = get(f"{gateway}/api/jobs/{prompt_id}")["lane"]
        lanes.setdefault(lane, []).append((times["execution_start"], times["execution_success"]))
    return lanes


def gaps_and_efficiency(
    lanes: dict[str, list[tuple[float, float]]], ideal: float
) -> tuple[list[float], float]:
    gaps = []
    for runs in lanes.values():
        runs.sort()
        gaps += [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(runs)]
    first = min(r[0] for runs in lanes.values() for r in runs)
    last = max(r[1] for runs in lanes.values() for r in runs)
    return gaps, ideal / (last - first)


def one_round(gateway: str, count: int, per_slot: int) -> tuple[list[float], float]:
    ids = [
        post(gateway + "/prompt", {"prompt": sleep_prompt(1.0, n)})["prompt_id"]
        for n in range(count * per_slot)
    ]
    until(
        lambda: drained(gateway),
        60 + 4 * per_slot,
        "the prompts",
    )
    return gaps_and_efficiency(runs_by_lane(gateway, ids), float(per_slot))


def idle_gap(count: int, per_slot: int, root: Path) -> None:
    env = {**os.environ, "COMFYFLEET_WORKER_TOKEN": TOKEN}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        # The baseline: backends the gateway connects to.
        urls = []
        for n in range(count):
            port = free_port()
            processes.append(serve(root / f"b{n}", port, "--local-slots", "1", "--testing-nodes"))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            until(lambda url=url: answers(url), 60, "a backend")
        port = free_port()
        backend_args = [arg for url in urls for arg in ("--backend", url)]
        processes.append(
            serve(root / "gw-push", port, "--local-slots", "0", "--testing-nodes", *backend_args)
        )
        push = f"http://127.0.0.1:{port}"
        until(
            lambda: answers(push) and len(up_lanes(push)) == count and all(up_lanes(push).values()),
            60,
            "the push gateway",
        )
        push_gaps, push_efficiency = one_round(push, count, per_slot)
        for process in processes:
            process.kill()
        processes.clear()
        # Workers: the same backends, each brought by a worker that connects out.
        port = free_port()
        config = gateway_config(root)
        processes.append(
            serve(
                root / "gw-workers",
                port,
                "--local-slots",
                "0",
                "--testing-nodes",
                "--config",
                str(config),
            )
        )
        pulled = f"http://127.0.0.1:{port}"
        until(lambda: answers(pulled), 60, "the workers' gateway")
        for n in range(count):
            processes.append(worker(pulled, root / f"w{n}", f"w{n}", env))
        until(
            lambda: len(up_lanes(pulled)) == count and all(up_lanes(pulled).values()),
            120,
            "the workers",
        )
        worker_gaps, worker_efficiency = one_round(pulled, count, per_slot)
    finally:
        for process in processes:
            process.kill()
    push_p50 = percentile(push_gaps, 0.5) * 1000
    figure("push_idle_gap_p50", push_p50, "ms")
    figure("push_idle_gap_p90", percentile(push_gaps, 0.9) * 1000, "ms")
    figure("worker_idle_gap_p50", percentile(worker_gaps, 0.5) * 1000, "ms", push_p50)
    figure(
        "worker_idle_gap_p90",
        percentile(worker_gaps, 0.9) * 1000,
        "ms",
        percentile(push_gaps, 0.9) * 1000,
    )
    figure("worker_gap_p50_minus_push", percentile(worker_gaps, 0.5) * 1000 - push_p50, "ms")
    figure("push_efficiency", push_efficiency, "x")
    figure("worker_efficiency", worker_efficiency, "x", push_efficiency)


class Churn:
    """Keeps `size` workers alive, each for a random `life` (None: until the end), a
    quarter SIGKILLed."""

    def __init__(
        self,
        gateway: str,
        size: int,
        root: Path,
        env: dict[str, str],
        life: tuple[float, float] | None,
    ) -> None:
        self.gateway, self.size, self.root, self.env = gateway, size, root, env
        self.life = life
        self.killed: dict[int, float] = {}  # a SIGKILLed worker's backend pid -> when
        self.alive: dict[str, tuple[subprocess.Popen[bytes], float]] = {}  # name -> (process, end)
        self.up_since: dict[str, float] = {}
        self.slot_seconds = 0.0
        self.kills = self.terms = self.started = 0
        self.stop = threading.Event()
        self.drained: float | None = None  # time.monotonic() when the queue was empty
        self.random = random.Random(7)

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            if len(self.alive) < self.size:  # one start a tick: a start costs seconds of CPU
                name = f"c{self.started}"
                self.started += 1
                process = worker(self.gateway, self.root / name, name, self.env)
                life = self.random.uniform(*self.life) if self.life else float("inf")
                self.alive[name] = (process, now + life)
            try:
                lanes = up_lanes(self.gateway)
            except OSError:  # a gateway slow to answer: look again next tick
                lanes = {}
            for name, (process, end) in list(self.alive.items()):
                lane = f"worker-bench.{name}"
                if lanes.get(lane) and name not in self.up_since:
                    self.up_since[name] = now
                if now >= end:
                    how = signal.SIGKILL if self.random.random() < 0.25 else signal.SIGTERM
                    self._note(name, process, how)
                    process.send_signal(how)
                    if how is signal.SIGKILL:
                        self.kills += 1
                    else:
                        self.terms += 1
                    del self.alive[name]
                    threading.Thread(
                        target=self._count_exit, args=(name, process), daemon=True
                    ).start()
            self.stop.wait(0.2)
        for name, (process, _end) in list(self.alive.items()):
            process.kill()
            self._count_exit(name, process)

    def _note(self, name: str, process: subprocess.Popen[bytes], how: signal.Signals) -> None:
        """Which backend process the worker ran, and when it was stopped (to tell, of a
        prompt run twice, whose run was cut short)."""
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        with contextlib.suppress(OSError), (self.root / "stops.jsonl").open("a") as notes:
            pids = [int(pid) for pid in children.read_text().split()]
            now = time.time()
            note = {"worker": name, "pids": pids, "signal": how.name, "time": now}
            notes.write(json.dumps(note) + "\n")
            if how is signal.SIGKILL:
                self.killed.update((pid, now) for pid in pids)

    def killed_after(self, run: dict[str, Any]) -> bool:
        """Whether the worker whose backend made this ledger line was SIGKILLed within a
        second after it."""
        killed = self.killed.get(run["pid"])
        return killed is not None and -0.1 <= killed - run["time"] <= 1.0

    def _count_exit(self, name: str, process: subprocess.Popen[bytes]) -> None:
        process.wait()
        since = self.up_since.get(name)
        if since is not None:
            # Up time while there was work: after the queue drained it is not wasted.
            until = min(time.monotonic(), self.drained or float("inf"))
            self.slot_seconds += max(0.0, until - since)


@dataclass
class Outcome:
    took: float  # s from the first worker's start to the queue drained
    efficiency: float  # the prompts' seconds / the workers' lanes' seconds up
    lost: int  # not ended in success
    missing: int  # no side effect at all
    twice: list[str]  # prompt ids whose side effect happened more than once
    killed_past_side_effect: int  # of those: the first run's worker SIGKILLed after it
    fleet: Churn
    polls: list[float]  # s each `GET /prompt` took meanwhile


def run_fleet(
    size: int, prompts: int, seconds: float, root: Path, churned: bool, hold: float
) -> Outcome:
    """`prompts` queued, then `size` workers start; with `churned` they come and go. A
    SIGKILLed worker's connection breaks, and its prompt runs again about 2 s later; the
    gateway's `hold` is what a worker gone silent would cost."""
    ledger = root / "ledger.jsonl"
    env = {**os.environ, "COMFYFLEET_WORKER_TOKEN": TOKEN, LEDGER_ENV: str(ledger)}
    port = free_port()
    config = gateway_config(root)
    gateway_process = serve(
        root / "gateway",
        port,
        *("--local-slots", "0", "--testing-nodes", "--config", str(config)),
        *("--backend-hold", f"{hold:g}"),
    )
    gateway = f"http://127.0.0.1:{port}"
    fleet = Churn(gateway, size, root, env, LIFE if churned else None)
    runner = threading.Thread(target=fleet.run, daemon=True)
    try:
        until(lambda: answers(gateway), 60, "the gateway")
        prompt = {
            "1": {"class_type": "LedgerAppend", "inputs": {"tag": "churn", "seconds": seconds}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }
        # Queued before any worker joins: the workers, not the client, set the pace.
        ids = [post(gateway + "/prompt", {"prompt": prompt})["prompt_id"] for _ in range(prompts)]
        started = time.monotonic()
        runner.start()
        polls: list[float] = []
        until(lambda: drained(gateway, polls), prompts * seconds * 4 + 300, "the prompts")
        fleet.drained = time.monotonic()
        took = fleet.drained - started
        history = get(gateway + "/history")
        lost = sum(
            1
            for prompt_id in ids
            if history.get(prompt_id, {}).get("status", {}).get("status_str") != "success"
        )
    finally:
        fleet.stop.set()
        runner.join(timeout=60)
        for process, _end in list(fleet.alive.values()):  # whatever the runner left
            process.kill()
        gateway_process.kill()
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    runs: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        runs.setdefault(line["prompt_id"], []).append(line)
    twice = [prompt_id for prompt_id in ids if len(runs.get(prompt_id, [])) > 1]
    return Outcome(
        took=took,
        efficiency=prompts * seconds / fleet.slot_seconds if fleet.slot_seconds else 0.0,
        lost=lost,
        missing=sum(1 for prompt_id in ids if prompt_id not in runs),
        twice=twice,
        killed_past_side_effect=sum(1 for p in twice if fleet.killed_after(runs[p][0])),
        fleet=fleet,
        polls=polls,
    )


def churn(size: int, prompts: int, seconds: float, root: Path, hold: float) -> None:
    (root / "steady").mkdir()
    (root / "churned").mkdir()
    steady = run_fleet(size, prompts, seconds, root / "steady", churned=False, hold=hold)
    churned = run_fleet(size, prompts, seconds, root / "churned", churned=True, hold=hold)
    figure("steady_seconds", steady.took, "s")
    figure("steady_efficiency", steady.efficiency, "x")
    figure("steady_side_effect_twice", len(steady.twice), "count")
    figure("churn_prompts", prompts, "count")
    figure("churn_lost", churned.lost, "count")
    figure("churn_side_effect_missing", churned.missing, "count")
    figure("churn_side_effect_twice", len(churned.twice), "count")
    # A run whose worker was SIGKILLed after the prompt's side effect but before its
    # result left the worker: the result died with it, and the prompt ran again.
    figure("churn_twice_killed_past_side_effect", churned.killed_past_side_effect, "count")
    figure("churn_twice_otherwise", len(churned.twice) - churned.killed_past_side_effect, "count")
    figure("churn_workers_started", churned.fleet.started, "count")
    figure("churn_sigkills", churned.fleet.kills, "count")
    figure("churn_sigterms", churned.fleet.terms, "count")
    figure("churn_seconds", churned.took, "s", steady.took)
    figure("churn_efficiency", churned.efficiency, "x", steady.efficiency)
    # The gateway's event loop under churn, seen from outside: `GET /prompt` ten times
    # a second while workers join, drain and die.
    figure("churn_poll_p99", percentile(churned.polls, 0.99) * 1000, "ms")
    figure("churn_poll_max", max(churned.polls) * 1000, "ms")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--per-slot", type=int, default=8)
    parser.add_argument("--churn-workers", type=int, default=20)
    parser.add_argument("--churn-prompts", type=int, default=2000)
    parser.add_argument("--churn-seconds", type=float, default=0.2)
    parser.add_argument("--skip-churn", action="store_true")
    parser.add_argument("--skip-gap", action="store_true")
    parser.add_argument("--keep", help="a folder to keep the processes' files in")
    parser.add_argument(
        "--backend-hold",
        type=float,
        default=30.0,
        help="the churn gateways' --backend-hold: how long a silent worker's prompt waits",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as folder:
        root = Path(args.keep or folder)
        if not args.skip_gap:
            (root / "gap").mkdir()
            idle_gap(args.workers, args.per_slot, root / "gap")
        if not args.skip_churn:
            (root / "churn").mkdir()
            churn(
                args.churn_workers,
                args.churn_prompts,
                args.churn_seconds,
                root / "churn",
                args.backend_hold,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
