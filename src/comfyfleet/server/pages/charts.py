"""The dashboard's charts: the last hour of this gateway, one sample every 10 seconds.

`Samples` is told what happens to jobs by the dashboard's observer (`FleetWatch`), and
of each lane's idle gaps by the metrics observer, which measures them (see
admin/metrics/jobs.py). Each call does a constant amount of work on the interval under
way: prompts ended by status, slot-seconds run by lane and by tenant, idle gaps by lane,
the queue's peak. A prompt runs from its first event: one prefetched into a backend's
queue only waits there.

An interval is closed by the first call or request after its end (no timer): its sums
become one `Sample`, which keeps the lanes and tenants that ran most by name and sums
the rest as one (`None`, shown as "other"). An hour of samples is kept in a ring. So
memory is bounded by KEEP samples of at most LANES_KEPT lanes and TENANTS_KEPT tenants
each, plus the prompts running now, whatever the load and however many lanes or
tenants there are; closing an interval reads each lane's slots once.

`charts` turns the ring into what the page draws, with at most LANES_SHOWN lanes and
TENANTS_SHOWN tenants named (the rest as "other"); it is built once per new sample.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from comfyfleet.domain.jobs import JobStatus

STEP = 10.0  # seconds a sample covers
KEEP = 360  # samples kept: an hour
LANES_KEPT = 24  # lanes a sample keeps by name
TENANTS_KEPT = 16  # tenants a sample keeps by name
LANES_SHOWN = 8  # lanes the page draws by name, the rest as one
TENANTS_SHOWN = 6  # tenants the page names, the rest as one
MAX_OPEN = 1000  # names an interval under way sums apart; newer ones go to "other"
MAX_RUNS = 100_000  # prompts followed at once (more than any fleet's slots)
MAX_LABEL = 100  # characters kept of a lane's or tenant's name

Name = str | None  # None: everything not kept by name


class LaneSample(NamedTuple):
    name: Name
    slots: int  # prompts it runs at once (summed for "other")
    busy: float  # slot-seconds it ran prompts
    gaps: int  # idle gaps ended (a prompt started after the lane sat idle)
    gap_seconds: float


@dataclass(frozen=True)
class Sample:
    completed: int  # prompts ended successfully
    failed: int  # prompts ended with an error
    stopped: int  # interrupted or cancelled
    pending: int  # prompts waiting at the end
    peak: int  # the most waiting at any time in it
    busy: float  # slot-seconds run on all lanes
    lanes: tuple[LaneSample, ...]
    tenants: tuple[tuple[Name, float], ...]  # slot-seconds run by tenant


@dataclass
class _Run:
    lane: str
    tenant: str
    since: float | None = None  # its first event; None while it waits (a backend's queue)


@dataclass
class _Open:
    """The interval under way."""

    peak: int = 0
    completed: int = 0
    failed: int = 0
    stopped: int = 0
    lane_busy: dict[Name, float] = field(default_factory=dict)
    lane_gaps: dict[Name, tuple[int, float]] = field(default_factory=dict)
    tenant_busy: dict[Name, float] = field(default_factory=dict)


def _key(sums: dict[Name, Any], name: str) -> Name:
    """`name`, or None once the interval sums MAX_OPEN others apart."""
    return name if name in sums or len(sums) < MAX_OPEN else None


def _label(name: str) -> str:
    return name[:MAX_LABEL]


class Samples:
    """The ring of samples and the interval under way (see the module's docstring).

    `lanes` gives each lane's name and the prompts it runs at once; `pending` the prompts
    waiting. Both are read when an interval closes, `pending` also when the queue changes.
    """

    def __init__(
        self,
        lanes: Callable[[], Iterable[tuple[str, int]]],
        pending: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        step: float = STEP,
        keep: int = KEEP,
    ) -> None:
        self._lanes, self._pending, self._clock = lanes, pending, clock
        self.step, self.keep = step, keep
        self.samples: deque[Sample] = deque(maxlen=keep)  # oldest first
        self.seq = 0  # samples closed since the start
        self._runs: dict[str, _Run] = {}
        self._open = _Open()
        self._start = clock()
        self._end = self._start + step
        self._charts: dict[bool, tuple[int, dict[str, Any]]] = {}

    # -- told as things happen (each O(1), but for a closing interval) -------------

    def started(self, prompt_id: str, lane: str, tenant: str) -> None:
        now = self.roll()
        earlier = self._runs.pop(prompt_id, None)  # followed again after a restart
        if earlier is not None and earlier.since is not None:
            self._ran(earlier, now - max(earlier.since, self._start))
        if len(self._runs) >= MAX_RUNS:
            del self._runs[next(iter(self._runs))]
        self._runs[prompt_id] = _Run(_label(lane), _label(tenant))

    def running(self, prompt_id: str) -> None:
        """An event of the prompt came: it runs (once per prompt, the rest cost a lookup)."""
        run = self._runs.get(prompt_id)
        if run is not None and run.since is None:
            run.since = self.roll()

    def ended(self, prompt_id: str, status: JobStatus | None) -> None:
        """The prompt ended (`status`), or stopped without an end (None: requeued)."""
        now = self.roll()
        run = self._runs.pop(prompt_id, None)
        if run is not None and run.since is not None:
            self._ran(run, now - max(run.since, self._start))
        if status == JobStatus.SUCCESS:
            self._open.completed += 1
        elif status == JobStatus.ERROR:
            self._open.failed += 1
        elif status is not None:
            self._open.stopped += 1

    def idle_gap(self, lane: str, seconds: float) -> None:
        self.roll()
        gaps = self._open.lane_gaps
        key = _key(gaps, _label(lane))
        count, total = gaps.get(key, (0, 0.0))
        gaps[key] = (count + 1, total + seconds)

    def queue_changed(self) -> None:
        self.roll()
        self._open.peak = max(self._open.peak, self._pending())

    def _ran(self, run: _Run, seconds: float) -> None:
        if seconds <= 0:
            return
        lanes, tenants = self._open.lane_busy, self._open.tenant_busy
        lane, tenant = _key(lanes, run.lane), _key(tenants, run.tenant)
        lanes[lane] = lanes.get(lane, 0.0) + seconds
        tenants[tenant] = tenants.get(tenant, 0.0) + seconds

    # -- closing intervals ------------------------------------------------------------

    def roll(self) -> float:
        """Close every interval that has ended; returns the time now."""
        now = self._clock()
        if now < self._end:
            return now
        ended = int((now - self._start) // self.step)
        if ended > self.keep:  # the older ones would leave the ring at once
            self._open = _Open()
            self._start += (ended - self.keep) * self.step
            self._end = self._start + self.step
        lanes = {_label(name): slots for name, slots in self._lanes()}
        pending = max(0, self._pending())
        self._close(lanes, pending)
        if self._end <= now:
            # Nothing was told in these (a call would have closed them): each is the
            # same, the prompts running throughout. One sample stands for them all.
            quiet = self._close(lanes, pending)
            while self._end <= now:
                self._append(quiet)
                self._start, self._end = self._end, self._end + self.step
        return now

    def _close(self, lanes: dict[str, int], pending: int) -> Sample:
        start, end = self._start, self._end
        for run in self._runs.values():
            if run.since is not None:
                self._ran(run, end - max(run.since, start))
        sums = self._open
        busy = sum(sums.lane_busy.values())
        sample = Sample(
            completed=sums.completed,
            failed=sums.failed,
            stopped=sums.stopped,
            pending=pending,
            peak=max(sums.peak, pending),
            busy=busy,
            lanes=_lanes(lanes, sums),
            tenants=_top(sums.tenant_busy, TENANTS_KEPT),
        )
        self._append(sample)
        self._open = _Open(peak=pending)
        self._start, self._end = end, end + self.step
        return sample

    def _append(self, sample: Sample) -> None:
        self.samples.append(sample)  # the oldest leaves a full ring
        self.seq += 1

    # -- what the page draws ------------------------------------------------------------

    def charts(self, admin: bool) -> dict[str, Any]:
        """The charts of the last hour: every chart for an admin; for a tenant only the
        lanes' (the others count every tenant's prompts). Built once per sample."""
        now = self.roll()
        cached = self._charts.get(admin)
        if cached is None or cached[0] != self.seq:
            cached = (self.seq, _charts(self.samples, self.step, admin))
            self._charts[admin] = cached
        # When the newest sample ended, seconds ago (the page places the rest from it).
        return {**cached[1], "seq": self.seq, "age": round(now - self._start, 2)}


def _lanes(slots: dict[str, int], sums: _Open) -> tuple[LaneSample, ...]:
    names: dict[Name, None] = dict.fromkeys(slots)
    names.update(dict.fromkeys(sums.lane_busy))
    names.update(dict.fromkeys(sums.lane_gaps))
    entries = [
        LaneSample(
            name,
            slots.get(name, 0) if name is not None else 0,
            sums.lane_busy.get(name, 0.0),
            *sums.lane_gaps.get(name, (0, 0.0)),
        )
        for name in names
    ]
    named = [e for e in entries if e.name is not None]
    if len(named) == len(entries) and len(named) <= LANES_KEPT:
        return tuple(entries)
    kept = heapq.nlargest(LANES_KEPT, named, key=lambda e: (e.busy, e.gaps))
    names_kept = {e.name for e in kept}
    rest = [e for e in entries if e.name not in names_kept]
    other = LaneSample(
        None,
        sum(e.slots for e in rest),
        sum(e.busy for e in rest),
        sum(e.gaps for e in rest),
        sum(e.gap_seconds for e in rest),
    )
    return (*kept, other)


def _top(sums: dict[Name, float], n: int) -> tuple[tuple[Name, float], ...]:
    """The `n` largest named values, then the sum of the rest as None (if any)."""
    named = [(k, v) for k, v in sums.items() if k is not None]
    if len(named) == len(sums) and len(named) <= n:
        return tuple(sorted(named, key=lambda kv: -kv[1]))
    kept = heapq.nlargest(n, named, key=lambda kv: kv[1])
    return (*kept, (None, sum(sums.values()) - sum(v for _, v in kept)))


def _charts(samples: Sequence[Sample], step: float, admin: bool) -> dict[str, Any]:
    per_minute = 60.0 / step
    charts: dict[str, Any] = {
        "step": step,
        "samples": len(samples),
        "lanes": _lane_charts(samples, step),
        "throughput": None,
        "queue": None,
        "tenants": None,
    }
    if not admin:
        return charts
    charts["throughput"] = {
        "completed": [round(s.completed * per_minute, 2) for s in samples],
        "failed": [round(s.failed * per_minute, 2) for s in samples],
        "stopped": [round(s.stopped * per_minute, 2) for s in samples],
        "totals": {
            "completed": sum(s.completed for s in samples),
            "failed": sum(s.failed for s in samples),
            "stopped": sum(s.stopped for s in samples),
        },
    }
    charts["queue"] = {
        "pending": [s.pending for s in samples],
        "peak": [s.peak for s in samples],
        "running": [round(s.busy / step, 2) for s in samples],
    }
    charts["tenants"] = _tenant_shares(samples)
    return charts


def _lane_charts(samples: Sequence[Sample], step: float) -> list[dict[str, Any]]:
    """The lanes that ran most over the window (all of them, in a small fleet: the
    newest sample's order breaks ties), each with its utilization per sample, then the
    rest as one."""
    busy: dict[Name, float] = {}
    for sample in reversed(samples):  # the newest sample's lanes first among equals
        for lane in sample.lanes:
            busy[lane.name] = busy.get(lane.name, 0.0) + lane.busy
    named = [name for name in busy if name is not None]
    shown = sorted(named, key=lambda n: -busy[n])[:LANES_SHOWN]  # a stable sort
    others = set(busy) - set(shown)  # None among them: what samples did not keep by name
    out = []
    for name in [*shown, None] if others else shown:
        series: list[float | None] = []
        ran = capacity = gap_seconds = 0.0
        gaps = slots = 0
        for sample in samples:
            if name is None:
                lanes = [lane for lane in sample.lanes if lane.name in others]
            else:
                lanes = [lane for lane in sample.lanes if lane.name == name]
            if not lanes:
                series.append(None)  # the lane was not there (or not kept by name)
                continue
            lane_busy = sum(lane.busy for lane in lanes)
            slots = sum(lane.slots for lane in lanes)
            ran += lane_busy
            capacity += slots * step
            gaps += sum(lane.gaps for lane in lanes)
            gap_seconds += sum(lane.gap_seconds for lane in lanes)
            series.append(round(min(1.0, lane_busy / (slots * step)), 3) if slots else None)
        out.append(
            {
                "name": name,
                "slots": slots,
                "utilization": series,
                "average": round(min(1.0, ran / capacity), 3) if capacity else None,
                "gaps": gaps,
                "gap_mean": round(gap_seconds / gaps, 3) if gaps else None,
                "gap_seconds": round(gap_seconds, 3),
            }
        )
    return out


def _tenant_shares(samples: Sequence[Sample]) -> dict[str, Any]:
    """Each tenant's share of the slot-seconds run over the window: the TENANTS_SHOWN
    that ran most, then the rest as one (None)."""
    seconds: dict[Name, float] = {}
    for sample in samples:
        for name, busy in sample.tenants:
            seconds[name] = seconds.get(name, 0.0) + busy
    total = sum(seconds.values())
    top = _top(seconds, TENANTS_SHOWN)
    return {
        "basis": "slot-seconds run",
        "total": round(total, 2),
        "shares": [
            {"name": name, "seconds": round(busy, 2), "share": round(busy / total, 4)}
            for name, busy in top
            if total > 0 and busy > 0
        ],
    }
