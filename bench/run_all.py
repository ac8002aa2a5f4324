"""Run every benchmark in bench/, collect their FIGURE lines, rewrite BENCHMARKS.md.

Benchmarks run one at a time, in the order of BENCHMARKS below; any other
`bench/bench_*.py` runs afterwards with no arguments. Their output streams
through; the FIGURE lines (see figures.py) become one table per benchmark:
figure, value, baseline measured in the same run, ratio, command. Hand-written
notes come from bench/notes.md. The raw results also go to bench/last_run.json,
from which `--rebuild` regenerates BENCHMARKS.md without running anything
(e.g. after editing notes.md).

    .venv/bin/python bench/run_all.py [--only KEY ...] [--rebuild] [--output BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import parse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = ".venv/bin/python"

# (script plus arguments, title); the key is the script plus arguments.
BENCHMARKS: list[tuple[str, str]] = [
    ("bench_validation.py", "Validation: 1,000-node prompts"),
    ("bench_engine.py", "Engine overhead per prompt"),
    ("bench_store.py", "Store: SQLite with group commit"),
    (
        "bench_store.py --store postgresql://postgres@127.0.0.1:5432/postgres",
        "Store: PostgreSQL against SQLite",
    ),
    (
        "bench_gateway.py --prompts 1000 --store postgresql://postgres@127.0.0.1:5432/postgres",
        "Server end to end, 1 and 8 slots (8 also on PostgreSQL)",
    ),
    ("bench_big_prompt.py", "One 10,000-node prompt: stalls, event log, memory (SQLite)"),
    (
        "bench_big_prompt.py --store postgresql://postgres@127.0.0.1:5432/postgres",
        "One 10,000-node prompt on PostgreSQL",
    ),
    ("bench_big_prompt.py --kill", "One 10,000-node prompt, SIGKILL mid-run (SQLite)"),
    (
        "bench_big_prompt.py --kill --store postgresql://postgres@127.0.0.1:5432/postgres",
        "One 10,000-node prompt, SIGKILL mid-run (PostgreSQL)",
    ),
    (
        "bench_fair_share.py --store postgresql://postgres@127.0.0.1:5432/postgres",
        "Tenants sharing the slots: noisy neighbour, weights, aging, caps",
    ),
    ("bench_fleet.py", "Scale-out over N ComfyUI backends, prefetch 0"),
    ("bench_fleet.py --prefetch 1", "Scale-out over N ComfyUI backends, prefetch 1"),
    (
        "bench_fleet.py --sizes 16 --store postgresql://postgres@127.0.0.1:5432/postgres",
        "Scale-out at N = 16 with the store on PostgreSQL",
    ),
    (
        "bench_fleet.py --sizes 16 --prefetch 1 "
        "--store postgresql://postgres@127.0.0.1:5432/postgres",
        "Scale-out at N = 16 with the store on PostgreSQL, prefetch 1",
    ),
    ("bench_fleet_scale.py", "Up to 1,000 simulated ComfyUI backends behind one gateway"),
    ("bench_gateways.py", "Several gateways on PostgreSQL"),
    ("bench_managed.py", "Managed backends: start-up and scale-out"),
    ("bench_workers.py", "Workers: idle gap against push backends, and churn"),
    ("bench_fanout.py", "Fan-out of paid API jobs"),
    ("bench_fleet_children.py", "The fleet inside one graph: children over four backends"),
    ("bench_pack.py", "Fan-out inside a real ComfyUI (the companion pack; needs COMFYUI_DIR)"),
    ("bench_ws_fanout.py", "WebSocket fan-out: 500 clients"),
    ("bench_history.py", "History at 1,000,000 entries"),
    ("bench_dashboard.py", "Fleet dashboard at 100 prompts/s"),
    ("bench_webhooks.py", "Webhook delivery at 100 job ends/s"),
    ("bench_follow.py", "Following prompts: late subscribers and SSE"),
    ("bench_metrics.py", "The cost of /metrics on throughput"),
]


def all_benchmarks() -> list[tuple[str, str]]:
    listed = {key.split()[0] for key, _ in BENCHMARKS}
    extra = [
        (path.name, path.stem.removeprefix("bench_").replace("_", " "))
        for path in sorted(HERE.glob("bench_*.py"))
        if path.name not in listed
    ]
    return BENCHMARKS + extra


def run(key: str, timeout: float) -> dict[str, Any]:
    script, *args = key.split()
    command = [sys.executable, str(HERE / script), *args]
    print(f"\n=== {key}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    figures: list[dict[str, str]] = []
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env, bufsize=1
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            parsed = parse(line)
            if parsed is not None:
                figures.append(parsed)
            if time.perf_counter() - start > timeout:
                proc.kill()
                print(f"=== {key}: killed after {timeout:.0f} s", flush=True)
                break
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    elapsed = time.perf_counter() - start
    print(f"=== {key}: exit {code}, {elapsed:.1f} s", flush=True)
    return {
        "key": key,
        "command": " ".join([PY, f"bench/{script}", *args]),
        "exit": code,
        "seconds": round(elapsed, 1),
        "figures": figures,
    }


def machine() -> dict[str, str]:
    memory = "?"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    now = datetime.datetime.now(datetime.UTC)
    return {
        "nproc": str(nproc),
        "memory": memory,
        "cpu": cpu,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
    }


def notes() -> tuple[str, dict[str, str]]:
    """The top text and the per-benchmark sections of notes.md."""
    path = HERE / "notes.md"
    text = path.read_text() if path.exists() else ""
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    sections = {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts), 2)}
    return parts[0].strip(), sections


def number(text: str, unit: str = "") -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    if value != value:  # nan
        return "n/a"
    if value.is_integer() and (unit == "count" or abs(value) >= 1000):
        shown = f"{int(value):,}"
    elif abs(value) >= 100:
        shown = f"{value:,.0f}"
    elif abs(value) >= 10:
        shown = f"{value:.1f}"
    else:
        shown = f"{value:.3g}"
    return f"{shown} {unit}" if unit and unit not in ("count", "x") else shown


def render(results: list[dict[str, Any]], host: dict[str, str], total: float) -> str:
    titles = dict(all_benchmarks())
    top, sections = notes()
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench` (bench/run_all.py); edit bench/notes.md instead. -->",
        "",
        f"Latest run's machine: {host['nproc']} CPUs (nproc), {host['memory']} memory, "
        f"{host['cpu']}, {host['system']}, Python {host['python']}; run on {host['date']}; "
        f"`make bench` took {total / 60:.1f} min.",
        "",
    ]
    if top:
        lines += [top, ""]
    for result in results:
        key = result["key"]
        lines += [f"## {titles.get(key, key)}", "", f"`{result['command']}`", ""]
        status = f"{result['seconds']:.0f} s"
        ran = result.get("machine", host)
        if (ran["cpu"], ran["date"]) != (host["cpu"], host["date"]):
            status += f" (an earlier run: {ran['cpu']}, {ran['date']})"
        if result["exit"] != 0:
            status += f", **failed (exit {result['exit']})**"
        lines += [f"Run time {status}.", ""]
        if result["figures"]:
            lines += [
                "| figure | value | baseline (same run) | ratio | command |",
                "|---|---|---|---|---|",
            ]
            for fig in result["figures"]:
                unit = fig["unit"]
                base = "" if fig["baseline"] == "-" else number(fig["baseline"], unit)
                ratio = "" if fig["ratio"] == "-" else fig["ratio"]
                lines.append(
                    f"| {fig['name']} | {number(fig['value'], unit)} | {base} | {ratio} "
                    f"| `{result['command']}` |"
                )
            lines.append("")
        else:
            lines += ["No figures.", ""]
        if sections.get(key):
            lines += [sections[key], ""]
    return "\n".join(lines).rstrip() + "\n"


def merged(earlier: dict[str, Any], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An earlier run's results (each with the machine and date it ran on) with `fresh`
    ones in their place, in the benchmarks' order."""
    kept = [{"machine": earlier["machine"]} | r for r in earlier["results"]]
    by_key = {r["key"]: r for r in kept} | {r["key"]: r for r in fresh}
    rank = {key: i for i, (key, _) in enumerate(all_benchmarks())}
    return sorted(by_key.values(), key=lambda r: rank.get(r["key"], len(rank)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", help="benchmark keys or script names to run")
    parser.add_argument("--rebuild", action="store_true", help="from last_run.json, no runs")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--results", type=Path, default=HERE / "last_run.json")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per benchmark")
    options = parser.parse_args()
    if options.rebuild:
        saved = json.loads(options.results.read_text())
        results, host, total = saved["results"], saved["machine"], saved["total_seconds"]
    else:
        chosen = [
            key
            for key, _ in all_benchmarks()
            if not options.only or key in options.only or key.split()[0] in options.only
        ]
        host = machine()
        start = time.perf_counter()
        results = [run(key, options.timeout) | {"machine": host} for key in chosen]
        total = time.perf_counter() - start
        if options.only and options.results.exists():
            # A partial run replaces its benchmarks' results and keeps the others.
            results = merged(json.loads(options.results.read_text()), results)
            total = sum(r["seconds"] for r in results)  # what `make bench` would take
        saved = {"machine": host, "total_seconds": round(total, 1), "results": results}
        options.results.write_text(json.dumps(saved, indent=1) + "\n")
    options.output.write_text(render(results, host, total))
    print(f"\nwrote {options.output} ({len(results)} benchmarks, {total / 60:.1f} min)")
    failed = [r["key"] for r in results if r["exit"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
