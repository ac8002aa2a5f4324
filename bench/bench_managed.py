"""Managed backends: from `comfyfleet serve` to the first prompt served, and scale-out.

The gateway (`--local-slots 0`) starts N instances itself from one `[[comfyui]]` table:
by default `comfyfleet serve --local-slots 1` processes (the one-at-a-time stand-in the
tests use); with `--comfyui DIR` real ComfyUI instances on the CPU (`--python` their
interpreter; `--testing-nodes DIR`, a custom-nodes folder holding ComfyUI's testing
pack, for its TestSleep node). Each ComfyUI gets its own user folder and database
(`--user-directory`, `--database-url`) and writes no bytecode, so its checkout is left
as it was. Figures, each from launching the gateway process:

- start_to_first_prompt: a client submits a short prompt as soon as the gateway
  answers HTTP (again every 50 ms while it is refused) until its history entry is
  there. Baseline: the same prompt on one instance started by hand with the same
  command line, from its launch;
- start_to_all_up: until the admin API shows every instance taking work;
- restart_to_first_prompt: the same after a SIGTERM and a second start on the same
  data dir (the gateway then knows the instances' nodes from their last run and
  queues the prompt at once);
- stop: from SIGTERM until the gateway has exited, its instances stopped;
- efficiency, gap_p50: as in bench_fleet.py, `--per-backend` x N Sleep(1) prompts
  through the gateway over its managed instances; baseline: a naive client
  round-robining the same prompts straight onto the same instances.

    .venv/bin/python bench/bench_managed.py [--per-gpu 2] [--per-backend 8] [--prefetch 0]
        [--comfyui DIR --python PYTHON --testing-nodes DIR] [--port-range 8300-8399]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fleet
from bench_fleet import call, gaps, makespan, naive, spans, submit, wait_done, warm_up
from comfyfleet.managed.spec import COMFYFLEET_COMMAND, parse_group, plan
from figures import figure
from harness import free_port, percentile, serve

STAND_IN = list(COMFYFLEET_COMMAND)


def table(options: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The `[[comfyui]]` table the gateway gets."""
    fields: dict[str, Any] = {
        "gpus": "cpu",
        "per_gpu": options.per_gpu,
        "prefetch": options.prefetch,
        "port_range": options.port_range,
    }
    if not options.comfyui:
        return {**fields, "command": STAND_IN}
    args = ["--user-directory", "{dir}", "--database-url", "sqlite:///{dir}/comfyui.db"]
    if options.testing_nodes:
        paths = root / "testing_nodes.yaml"
        paths.write_text(f"testing:\n    custom_nodes: {json.dumps(options.testing_nodes)}\n")
        args += ["--extra-model-paths-config", str(paths)]
    fields |= {"path": options.comfyui, "args": args}
    fields["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}
    return fields | ({"python": options.python} if options.python else {})


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def first_prompt(
    url: str, started: float, proc: subprocess.Popen[bytes], timeout: float = 600.0
) -> float:
    """Seconds from `started` until a short prompt, submitted as soon as `url` takes it,
    has its history entry there."""
    deadline = time.monotonic() + timeout
    prompt = bench_fleet.sleep_prompt(3_000_000 + int(started * 1000) % 1_000_000, 0.01)
    while True:
        try:
            prompt_id = submit(url, prompt)
            break
        except OSError:  # not listening yet, or refused (its nodes unknown so far)
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.05)
    wait_done(url, [prompt_id], timeout)
    return time.perf_counter() - started


def all_up(url: str, n: int, started: float, timeout: float = 600.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        backends = call(url + "/api/fleet/backends")["backends"]
        if sum(b["state"] == "up" for b in backends) == n:
            return time.perf_counter() - started
        if time.monotonic() > deadline:
            raise TimeoutError(f"managed backends did not come up: {backends}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> float:
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    return time.perf_counter() - started


def by_hand(fields: dict[str, Any], root: Path) -> float:
    """One instance started with the command line the gateway would use: seconds from its
    launch to the short prompt served, on its own."""
    group = parse_group(fields, root)
    spec = plan([group], root / "by-hand", gpus_found=[], avoid=set())[0]
    for sub in ("input", "output", "temp"):
        (spec.folder / sub).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        spec.argv(None),
        cwd=spec.cwd,
        env=spec.environment(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return first_prompt(spec.url, started, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def efficiency(url: str, per_backend: int) -> dict[str, float]:
    """bench_fleet's run over the gateway's own instances."""
    backends = call(url + "/api/fleet/backends")["backends"]
    urls = [b["url"] for b in backends]
    warm_up(url, urls)
    count = per_backend * len(urls)
    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(lambda i: submit(url, bench_fleet.sleep_prompt(i)), range(count)))
    wait_done(url, ids, timeout=per_backend * 10 + 60)
    runs = spans(urls, set(ids))
    naive_runs = naive(urls, count)
    return {
        "wall": makespan(runs),
        "gap50": percentile(gaps(runs), 0.5),
        "naive_wall": makespan(naive_runs),
        "naive_gap50": percentile(gaps(naive_runs), 0.5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-gpu", type=int, default=2, help="instances (all on the CPU)")
    parser.add_argument("--per-backend", type=int, default=8, help="Sleep(1) prompts each")
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--comfyui", help="a ComfyUI folder (default: the comfyfleet stand-in)")
    parser.add_argument("--python", help="ComfyUI's interpreter (default: its venv)")
    parser.add_argument("--testing-nodes", help="custom-nodes folder with its testing pack")
    parser.add_argument("--port-range", default="8300-8399", help="the instances' ports")
    options = parser.parse_args()
    bench_fleet.SLEEP_NODE = "TestSleep" if options.comfyui else "Sleep"
    n = options.per_gpu
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fields = table(options, root)
        baseline = by_hand(fields, root)
        config = root / "gateway.toml"
        config.write_text(
            "[[comfyui]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in fields.items())
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = ["--local-slots", "0", "--config", str(config)]
        if not options.comfyui:
            gateway.append("--testing-nodes")

        started = time.perf_counter()
        proc = serve(root / "gw", port, *gateway)
        try:
            first = first_prompt(url, started, proc)
            up = all_up(url, n, started)
            fig = efficiency(url, options.per_backend)
        finally:
            stopped = stop(proc)
        started = time.perf_counter()
        proc = serve(root / "gw", port, *gateway)
        try:
            again = first_prompt(url, started, proc)
        finally:
            stop(proc)

    ideal = float(options.per_backend)
    kind = f"ComfyUI ({options.comfyui})" if options.comfyui else "comfyfleet stand-ins"
    print(f"{n} managed {kind}, prefetch {options.prefetch}, {options.per_backend} Sleep(1) each")
    print(f"first prompt served {first:.2f} s after start (one by hand: {baseline:.2f} s)")
    print(
        f"all {n} up {up:.2f} s; after a restart, first prompt {again:.2f} s; stop {stopped:.2f} s"
    )
    print(
        f"efficiency {ideal / fig['wall']:.3f} (naive {ideal / fig['naive_wall']:.3f}), "
        f"gap p50 {fig['gap50']:.1f} ms (naive {fig['naive_gap50']:.1f} ms)"
    )
    figure("start_to_first_prompt", first, "s", baseline)
    figure("start_to_all_up", up, "s")
    figure("restart_to_first_prompt", again, "s", baseline)
    figure("stop", stopped, "s")
    figure(f"n{n}_efficiency", ideal / fig["wall"], "x", ideal / fig["naive_wall"])
    figure(f"n{n}_gap_p50", fig["gap50"], "ms", fig["naive_gap50"])


if __name__ == "__main__":
    main()
