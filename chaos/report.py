"""CHAOS.md: each schedule's figures in a table, then what each failing one found."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from checker import Verdict
from nemesis import KINDS, Injected

#: Findings shown per schedule (all of them are in its log).
SHOWN = 25


@dataclass(frozen=True)
class Unplanned:
    """What the machine did on its own during a schedule (cluster.watch_machine)."""

    kind: str  # clock-step, stall
    what: str  # "clock-step +2.6s"
    start: float  # seconds after the schedule's start

    def describe(self) -> str:
        return f"{self.what} @{self.start:.0f}s (not injected)"


@dataclass
class Outcome:
    seed: int
    injected: list[Injected]
    verdict: Verdict
    duration: float  # seconds, from the first submit to the checks' end
    settled: bool  # every prompt ended before the checks
    unplanned: list[Unplanned]


def faults_text(injected: list[Injected], unplanned: list[Unplanned]) -> str:
    events = sorted(
        [(i.start, i.describe()) for i in injected] + [(u.start, u.describe()) for u in unplanned]
    )
    return "; ".join(text for _, text in events) or "none"


def row(outcome: Outcome) -> str:
    v = outcome.verdict
    cells = [
        str(outcome.seed),
        faults_text(outcome.injected, outcome.unplanned),
        f"{v.prompts - v.unsent}" + (f" (+{v.unsent} never acknowledged)" if v.unsent else ""),
        str(v.lost),
        str(v.ran_twice),
        str(v.fenced_out),
        str(v.stale_files),
        str(v.webhook_missing),
        str(v.ended_twice),
        str(v.history_disagrees),
        str(v.stream_errors),
        str(v.interrupted),
        str(v.failed),
        str(v.reruns),
        str(v.cut_short),
        f"{outcome.duration:.0f} s" + ("" if outcome.settled else " (not settled)"),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| seed | faults injected (kind, target, how long, when) | prompts | lost | ran twice "
    "| fenced-out side effects | stale files served | webhook ends missing | ended twice "
    "| history differs | stream errors | interrupted | failed | started again | cut short "
    "| duration |\n" + "|---" * 16 + "|"
)


#: The findings that fail a schedule, as the by-fault table names them.
FINDINGS = {
    "lost": "lost",
    "ran_twice": "ran twice",
    "fenced_out": "fenced-out side effects",
    "stale_files": "stale files served",
    "webhook_missing": "webhook ends missing",
    "ended_twice": "ended twice",
    "history_disagrees": "history differs",
    "stream_errors": "stream errors",
    "interrupted": "interrupted",
    "unsent": "never acknowledged",
}


def by_fault(outcomes: list[Outcome]) -> list[str]:
    """What was found, by the kind of the last fault injected before it arose."""
    counts: Counter[tuple[str, str]] = Counter()
    injected: Counter[str] = Counter()
    for outcome in outcomes:
        counts.update(outcome.verdict.by_fault)
        injected.update(i.fault.kind for i in outcome.injected)
        injected.update(u.kind for u in outcome.unplanned)
    known = (*KINDS, "clock-step", "stall", "none")
    kinds = [k for k in known if injected[k] or any(f == k for _, f in counts)]
    shown = [c for c in FINDINGS if any(counts[(c, k)] for k in kinds)]
    if not shown:
        return []
    head = "| last fault before it | injected | " + " | ".join(FINDINGS[c] for c in shown) + " |"
    rows = [head, "|---" * (len(shown) + 2) + "|"]
    for kind in kinds:
        cells = [kind, str(injected[kind]) if kind != "none" else "-"]
        rows.append("| " + " | ".join(cells + [str(counts[(c, kind)]) for c in shown]) + " |")
    return rows


def summary(outcomes: list[Outcome]) -> str:
    def total(name: str) -> int:
        return sum(int(getattr(o.verdict, name)) for o in outcomes)

    failing = [o for o in outcomes if o.verdict.failures()]
    return (
        f"{len(outcomes)} schedules, {total('prompts') - total('unsent')} prompts, "
        f"{sum(len(o.injected) for o in outcomes)} faults: {total('lost')} lost, "
        f"{total('ran_twice')} ran twice, {total('fenced_out')} fenced-out side effects, "
        f"{total('stale_files')} stale files served, {total('webhook_missing')} webhook ends "
        f"missing, {total('ended_twice')} ended twice, {total('history_disagrees')} history "
        f"differs, {total('stream_errors')} stream errors, {total('interrupted')} "
        f"interrupted, {total('failed')} failed; "
        f"{len(failing)} of {len(outcomes)} schedules failed"
    )


def commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return found.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(path: Path, outcomes: list[Outcome], settings: str, command: str) -> None:
    today = datetime.date.today().isoformat()
    parts = [
        "# Chaos",
        "",
        f"`{command}` on {today}, commit {commit()}, {platform.machine()} with "
        f"{os.cpu_count()} CPUs. {settings}. What each column means, and how the checks decide: "
        "[chaos/README.md](chaos/README.md). Replay a schedule with "
        '`make chaos ARGS="--seed SEED --schedules 1"` (same faults, targets, durations, '
        "prompts and gateways; the interleaving is the machine's).",
        "",
        f"**{summary(outcomes)}.**",
        "",
        HEADER,
        *(row(o) for o in outcomes),
        "",
    ]
    table = by_fault(outcomes)
    if table:
        parts += [
            "What was found, by the kind of the last fault injected before it arose (each "
            "finding names its fault in the findings below):",
            "",
            *table,
            "",
        ]
    failing = [o for o in outcomes if o.verdict.failures() or not o.settled]
    if failing:
        parts += ["## Findings", ""]
    for outcome in failing:
        problems = outcome.verdict.problems
        parts += [
            f"### Seed {outcome.seed}",
            "",
            f"Faults: {faults_text(outcome.injected, outcome.unplanned)}."
            + ("" if outcome.settled else " Not every prompt had ended when it was checked."),
            "",
            "```",
            *problems[:SHOWN],
            *([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else []),
            "```",
            "",
        ]
    path.write_text("\n".join(parts))
