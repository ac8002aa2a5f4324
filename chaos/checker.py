"""The checker: once the faults are healed and the work has settled, it reads what
happened (every gateway's history, jobs and `/view`, the event log, the ledgers, the
webhook receiver, the store's audit and the nemesis's journal) and judges it. Reading
(`observe`) and judging (`judge`, no I/O) are apart, so a judgment can be re-made.

The definitions (chaos/README.md explains them):
- A ledger line is *held* when, at the time it was written, the store still gave its
  run the job: for a gateway's own run, the job was running (or set aside, its start
  about to be recorded) at that attempt with that gateway as owner; for a backend's, the
  job was running on (or set aside for) that backend's lane. A line that is not held
  was written by a *fenced-out* run.
- A held line is *cut short* when its process was SIGKILLed or SIGSTOPped after
  writing it and before the prompt's end was committed: the run could not record its
  end, so running the prompt again was the right thing to do (at least once).
- A prompt *ran twice* when its ledger has more lines than one plus its cut-short
  ones: a side effect happened again without a fault that made it necessary.
- A prompt is *lost* when it was acknowledged but has no end, or succeeded with no
  held line (no run of it did its side effect).
- A *stale file*: a gateway's `/view` of an output its history lists returns other
  bytes than the gateway that recorded the end serves, or fails; or the recorded file's
  pixels name a fenced-out run (or none).
- A *missing webhook end*: an ended prompt without a delivery. Two deliveries of one
  prompt with different webhook-ids are two ends (*ended twice*), as are two terminal
  commits in the audit.
- A *stream error*: the prompt's event log shows no end event, more than one, no done
  signal, or more `execution_start` frames than the store recorded starts.
- *Interrupted*: ended interrupted or cancelled, which the workload never asks for.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from audit import TERMINAL, Change, state_at
from cluster import Signalled
from receiver import Delivery
from workload import Submitted

TOKEN_BYTES = 16  # comfyfleet.nodes.testing.TOKEN_BYTES
END_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


@dataclass(frozen=True)
class Line:
    """One ledger line: a run's side effect, done."""

    process: str  # g1, b2, comfyui: whose ledger
    prompt_id: str
    attempt: int | None  # the job's attempt in that process's store
    pid: int
    token: str
    time: float


@dataclass
class Observation:
    prompts: list[Submitted]
    gateways: list[str]
    histories: dict[str, dict[str, Any]]  # gateway -> its GET /history
    jobs: dict[str, dict[str, Any]]  # prompt_id -> GET /api/jobs/{id}
    views: dict[tuple[str, str], dict[str, bytes | None]]  # (prompt, file) -> gateway -> bytes
    streams: dict[str, list[str] | None]  # prompt_id -> event types (None: unreadable)
    lines: list[Line]
    torn_lines: int
    changes: dict[str, list[Change]]
    journal: list[Signalled]
    deliveries: list[Delivery]
    faults: list[Window] = field(default_factory=list)


@dataclass(frozen=True)
class Window:
    """A fault injected: its kind, how the report names it, when it began."""

    kind: str
    label: str
    start: float  # time.time()


@dataclass
class Verdict:
    prompts: int = 0
    unsent: int = 0  # never acknowledged by any gateway
    lost: int = 0
    failed: int = 0  # ended with an error
    interrupted: int = 0  # ended interrupted or cancelled: the workload never asks for it
    ran_twice: int = 0
    cut_short: int = 0  # lines of runs cut short by a fault: re-runs allowed
    fenced_out: int = 0  # lines written by runs the store had fenced out
    stale_files: int = 0  # (file, gateway) pairs served wrong
    webhook_missing: int = 0
    ended_twice: int = 0
    history_disagrees: int = 0
    stream_errors: int = 0
    reruns: int = 0  # prompts that started more than once (as the store recorded)
    problems: list[str] = field(default_factory=list)  # one line per finding
    # (what was found, the kind of the last fault injected before it arose): how many
    by_fault: Counter[tuple[str, str]] = field(default_factory=Counter)

    def failures(self) -> int:
        return (
            self.unsent
            + self.lost
            + self.ran_twice
            + self.fenced_out
            + self.stale_files
            + self.webhook_missing
            + self.ended_twice
            + self.history_disagrees
            + self.stream_errors
            + self.interrupted
        )


# -- reading ---------------------------------------------------------------------------


def read_ledgers(folders: dict[str, Path]) -> tuple[list[Line], int]:
    """Every process's ledger lines; and how many lines were not whole JSON."""
    lines, torn = [], 0
    for process, folder in folders.items():
        path = folder / "ledger.jsonl"
        if not path.exists():
            continue
        for raw in path.read_text().splitlines():
            try:
                item = json.loads(raw)
                lines.append(
                    Line(
                        process,
                        str(item["prompt_id"]),
                        item.get("attempt"),
                        int(item["pid"]),
                        str(item["token"]),
                        float(item["time"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                torn += 1
    return lines, torn


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=60)
    async with session.get(url, timeout=timeout) as reply:
        reply.raise_for_status()
        return await reply.json(content_type=None)


async def _bytes(session: aiohttp.ClientSession, url: str) -> bytes | None:
    try:
        timeout = aiohttp.ClientTimeout(total=20)
        async with session.get(url, timeout=timeout) as reply:
            return await reply.read() if reply.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _stream(session: aiohttp.ClientSession, url: str) -> list[str] | None:
    """The event types of a prompt's SSE stream, read to its end."""
    types = []
    try:
        timeout = aiohttp.ClientTimeout(total=15)
        async with session.get(url, timeout=timeout) as reply:
            if reply.status != 200:
                return None
            async for raw in reply.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    types.append(line[len("event: ") :])
                elif (
                    line.startswith("data: ")
                    and types
                    and types[-1] == "executing"
                    and json.loads(line[len("data: ") :]).get("node") is None
                ):
                    types[-1] = "done"
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return types


def output_files(entry: dict[str, Any]) -> list[dict[str, str]]:
    files = []
    for output in (entry.get("outputs") or {}).values():
        for image in output.get("images", []):
            files.append({k: str(image.get(k, "")) for k in ("filename", "subfolder", "type")})
    return files


async def observe(
    prompts: list[Submitted],
    urls: dict[str, str],
    folders: dict[str, Path],
    changes: dict[str, list[Change]],
    journal: list[Signalled],
    deliveries: list[Delivery],
) -> Observation:
    ids = [p.prompt_id for p in prompts if p.acked_at is not None]
    names = sorted(urls)
    gate = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as session:

        async def limited(coro: Any) -> Any:
            async with gate:
                return await coro

        histories: dict[str, dict[str, Any]] = {}
        for name in names:
            try:
                histories[name] = await _get(session, f"{urls[name]}/history?max_items=100000")
            except (aiohttp.ClientError, TimeoutError, ValueError):
                histories[name] = {}  # every prompt then differs there
        first = urls[names[0]]
        found = await asyncio.gather(
            *(limited(_get(session, f"{first}/api/jobs/{p}")) for p in ids), return_exceptions=True
        )
        jobs = {p: j for p, j in zip(ids, found) if isinstance(j, dict)}
        views: dict[tuple[str, str], dict[str, bytes | None]] = {}
        wanted = []
        for prompt_id in ids:
            entry = next((h[prompt_id] for h in histories.values() if prompt_id in h), None)
            for file in output_files(entry or {}):
                query = urllib.parse.urlencode(file)
                for name in names:
                    wanted.append((prompt_id, file["filename"], name, f"{urls[name]}/view?{query}"))
        got = await asyncio.gather(*(limited(_bytes(session, w[3])) for w in wanted))
        for (prompt_id, filename, name, _), data in zip(wanted, got):
            views.setdefault((prompt_id, filename), {})[name] = data
        read = await asyncio.gather(
            *(
                limited(_stream(session, f"{urls[names[n % len(names)]]}/api/jobs/{p}/events"))
                for n, p in enumerate(ids)
            )
        )
        streams = dict(zip(ids, read))
    lines, torn = read_ledgers(folders)
    return Observation(
        prompts, names, histories, jobs, views, streams, lines, torn, changes, journal, deliveries
    )


def token_of(png: bytes) -> str | None:
    try:
        pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError):
        return None
    return pixels.reshape(-1)[:TOKEN_BYTES].tobytes().hex()


# -- judging ---------------------------------------------------------------------------


def holds(state: Change | None, line: Line, gateways: set[str]) -> bool:
    """Whether, in `state`, the store gives the job to the line's run."""
    if state is None:
        return False
    if line.process in gateways:
        if state.owner != line.process:
            return False
        running = state.status == "running" and state.attempt == line.attempt
        set_aside = (
            state.status == "pending"
            and state.lane is not None
            and line.attempt == state.attempt + 1
        )
        return running or set_aside
    # A backend's lane is named `backend:<name>`.
    on_it = state.lane in (line.process, f"backend:{line.process}")
    return on_it and state.status in ("running", "pending")


def held(line: Line, changes: list[Change], gateways: set[str]) -> bool:
    """Whether the store still gave the line's run the job when the line was written."""
    return holds(state_at(changes, line.time), line, gateways)


def fenced_at(line: Line, changes: list[Change], gateways: set[str]) -> float | None:
    """When the store last took the job from the line's run before the line was written
    (None: it never gave it the job)."""
    fenced, holding = None, False
    for change in changes:
        if change.at > line.time:
            break
        now = holds(change, line, gateways)
        if holding and not now:
            fenced = change.at
        holding = now
    return fenced


def cut_short(line: Line, end: float, journal: list[Signalled]) -> bool:
    return any(
        s.target == line.process
        and s.pid == line.pid
        and s.action in ("SIGKILL", "SIGSTOP")
        and line.time < s.at < end
        for s in journal
    )


def first_takeover(changes: list[Change]) -> float | None:
    """When the store first took the job from a run that had it (re-queued it, or moved
    its attempt on): what a finding about the prompt's runs is put down to."""
    for before, after in itertools.pairwise(changes):
        left = after.status != "running" or after.attempt != before.attempt
        if before.status == "running" and after.status not in TERMINAL and left:
            return after.at
    return None


def blame(faults: list[Window], when: float) -> Window | None:
    """The last fault injected at or before `when`."""
    before = [w for w in faults if w.start <= when]
    return before[-1] if before else None


def judge(obs: Observation, t0: float) -> Verdict:
    """The figures of one schedule; `t0` (time.time() at its start) dates the findings."""
    v = Verdict(prompts=len(obs.prompts))
    gateways = set(obs.gateways)
    lines_of: dict[str, list[Line]] = {}
    for line in obs.lines:
        lines_of.setdefault(line.prompt_id, []).append(line)
    by_token = {line.token: line for line in obs.lines}
    ends_of: dict[str, set[str]] = {}
    for delivery in obs.deliveries:
        ends_of.setdefault(delivery.prompt_id, set()).add(delivery.id)
    if obs.torn_lines:
        v.problems.append(f"{obs.torn_lines} ledger lines were not whole")

    def rel(when: float) -> str:
        return f"{when - t0:.1f}s"

    def found(category: str, prompt_id: str, when: float, text: str, count: int = 1) -> None:
        """A finding of `category` (a Verdict field), arisen at `when`."""
        setattr(v, category, getattr(v, category) + count)
        fault = blame(obs.faults, when)
        v.by_fault[(category, "none" if fault is None else fault.kind)] += count
        after = "before any fault" if fault is None else f"after {fault.label}"
        v.problems.append(f"{prompt_id}: {text} [{rel(when)}, {after}]")

    for item in obs.prompts:
        pid = item.prompt_id
        if item.acked_at is None:
            found("unsent", pid, t0 + item.planned, "never acknowledged by a gateway")
            continue
        changes = obs.changes.get(pid, [])
        last = changes[-1].at if changes else item.acked_at
        ends = [c for c in changes if c.status in TERMINAL]
        end = ends[0].at if ends else float("inf")
        if len(ends) > 1:
            states = [(c.status, c.attempt) for c in ends]
            found("ended_twice", pid, ends[1].at, f"{len(ends)} terminal commits: {states}")
        moved_on = first_takeover(changes)
        starts = sum(
            1
            for before, after in zip([None, *changes], changes)
            if after.status == "running" and (before is None or before.status != "running")
        )
        if starts > 1:
            v.reruns += 1
        entries = {g: h.get(pid) for g, h in obs.histories.items()}
        present = [e for e in entries.values() if e is not None]
        status = (obs.jobs.get(pid) or {}).get("status")
        if not present:
            seen = [(c.status, c.attempt, c.owner) for c in changes]
            found("lost", pid, last, f"no history entry on any gateway (job {status}, {seen})")
            continue
        if len(present) != len(entries) or any(e != present[0] for e in present):
            missing = [g for g, e in entries.items() if e is None]
            found("history_disagrees", pid, last, f"history differs (missing on {missing})")
        status_str = (present[0].get("status") or {}).get("status_str")
        if status in ("interrupted", "cancelled"):
            found("interrupted", pid, moved_on or end, f"{status}, which no client asked for")
        elif status_str != "success":
            v.failed += 1
            v.problems.append(f"{pid}: ended with status {status_str} (not counted a failure)")
        # The side effect.
        lines = sorted(lines_of.get(pid, []), key=lambda line: line.time)
        kept = [line for line in lines if held(line, changes, gateways)]
        fenced = [line for line in lines if line not in kept]
        short = [line for line in kept if cut_short(line, end, obs.journal)]
        v.cut_short += len(short)
        for line in fenced:
            when = fenced_at(line, changes, gateways)
            after = "" if when is None else f", {line.time - when:.2f}s after the store moved on"
            text = (
                f"side effect of a fenced-out run: {line.process} attempt {line.attempt} "
                f"pid {line.pid} at {rel(line.time)}{after}"
            )
            found("fenced_out", pid, line.time if when is None else when, text)
        if status_str == "success" and not kept:
            found("lost", pid, last, "succeeded, but no run that held it did its side effect")
        if len(lines) - len(short) > 1:
            runs = ", ".join(f"{x.process}#{x.attempt}@{rel(x.time)}" for x in lines)
            text = f"side effect done {len(lines)} times ({len(short)} cut short): {runs}"
            found("ran_twice", pid, lines[0].time if moved_on is None else moved_on, text)
        # The files, through every gateway.
        recorder = (obs.jobs.get(pid) or {}).get("gateway")
        for file in output_files(present[0]):
            served = obs.views.get((pid, file["filename"]), {})
            reference = served.get(recorder) if recorder in served else None
            token = None if reference is None else token_of(reference)
            source = by_token.get(token or "")
            if reference is None or source is None or source in fenced:
                what = "fails" if reference is None else "names no held run"
                text = f"{file['filename']} on {recorder}, which recorded the end, {what}"
                found("stale_files", pid, end, text)
            for gateway, data in served.items():
                if gateway != recorder and data != reference:
                    other = None if data is None else by_token.get(token_of(data) or "")
                    origin = "nothing" if data is None else (
                        f"{other.process}#{other.attempt}'s file" if other else "an unknown file"
                    )  # fmt: skip
                    text = f"{file['filename']} on {gateway} serves {origin}"
                    found("stale_files", pid, moved_on or end, text)
        # The webhook end, and the stream.
        count = len(ends_of.get(pid, set()))
        if count == 0:
            found("webhook_missing", pid, end, "no webhook end delivered")
        elif count > 1:
            found("ended_twice", pid, end, f"{count} webhook ends (distinct ids)")
        stream = obs.streams.get(pid)
        if stream is None:
            found("stream_errors", pid, end, "its event stream could not be read to its end")
        else:
            kinds = Counter(stream)
            finals = sum(kinds[t] for t in END_EVENTS)
            if finals != 1 or kinds["done"] != 1 or kinds["execution_start"] > max(starts, 1):
                text = (
                    f"event stream: {kinds['execution_start']} execution_start for {starts} "
                    f"recorded starts, {finals} end events, {kinds['done']} done signals"
                )
                found("stream_errors", pid, moved_on or end, text)
    return v
