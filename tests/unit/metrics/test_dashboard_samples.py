"""The dashboard's chart samples: rates, utilization, idle gaps and tenant shares from
known events (the dashboard's observer and the metrics observer, told through the
scheduler's observer fan-out, on a clock the test moves), their bounds under any load,
and a real scheduler's prompts counted as they ran."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob
from comfyfleet.engine.events import Message
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.admin.metrics.jobs import JobMetrics
from comfyfleet.server.pages.charts import (
    KEEP,
    LANES_KEPT,
    LANES_SHOWN,
    MAX_OPEN,
    TENANTS_KEPT,
    TENANTS_SHOWN,
)
from comfyfleet.server.pages.dashboard import FleetWatch
from comfyfleet.store.sqlite import SQLiteStore
from tests.helpers import FakeTime
from tests.unit.scheduler.test_handoff import sleep_prompt

DONE = JobResult(JobStatus.SUCCESS, {}, {}, [])
FAILED = JobResult.failed(
    {"exception_type": "RuntimeError", "exception_message": "x" * 1000, "node_type": "Fail"}
)
START = Message("execution_start", {"prompt_id": "p"})


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Scheduler]:
    """A real scheduler with a local lane of two slots (not started: its lanes and
    pending count are what the samples read)."""
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    try:
        yield Scheduler(store, [LocalLane(engine, 2)])
    finally:
        await store.close()
        engine.close()


class Fleet:
    """The dashboard's observer and the metrics observer, told as the scheduler tells
    them, on one clock."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.clock = FakeTime()
        self.watch = FleetWatch(scheduler, clock=self.clock.clock, step=10.0)
        self.metrics = JobMetrics(CollectorRegistry(), self.clock.clock)
        self.metrics.idle_gap_listeners.append(self.watch.charts.idle_gap)
        self.observers = Observers(self.watch, self.metrics)

    def at(self, now: float) -> Fleet:
        self.clock.now = now
        return self

    def start(self, job: Job) -> Job:
        started = replace(job, started_at=self.clock.now)
        self.observers.job_started(started)
        return started

    def event(self, job: Job) -> None:
        self.observers.job_event(job, START)


def job(prompt_id: str, tenant: str, created: float = 0.0, lane: str = "local") -> Job:
    return Job(
        prompt_id, 0, False, 1, {}, {}, [], None, JobStatus.RUNNING, 1, lane, created, tenant=tenant
    )


def test_rates_utilization_gaps_and_shares_from_known_events(scheduler: Scheduler) -> None:
    fleet = Fleet(scheduler)
    a = fleet.at(1).start(job("a", "alice"))
    fleet.event(a)  # a runs from 1
    b = fleet.at(2).start(job("b", "bob"))  # sent at 2, runs from its first event at 3
    fleet.at(3).event(b)
    fleet.at(5).observers.job_finished(a, DONE)
    fleet.at(15).observers.job_finished(b, FAILED)  # the lane is idle from 15
    c = fleet.at(17).start(job("c", "alice", created=16))  # waited from 16: a 1 s gap
    fleet.event(c)
    charts = fleet.at(30).watch.charts.charts(admin=True)

    assert charts["samples"] == 3 and charts["seq"] == 3 and charts["age"] == 0
    throughput = charts["throughput"]
    assert throughput["completed"] == [6.0, 0.0, 0.0]  # per minute: one in 10 s
    assert throughput["failed"] == [0.0, 6.0, 0.0]
    assert throughput["totals"] == {"completed": 1, "failed": 1, "stopped": 0}
    # Slot-seconds run on the lane's two slots: a 4 + b 7; b 5 + c 3; c 10.
    assert charts["queue"]["running"] == [1.1, 0.8, 1.0]
    [local] = charts["lanes"]
    assert local["name"] == "local" and local["slots"] == 2
    assert local["utilization"] == [0.55, 0.4, 0.5]
    assert local["average"] == round(29 / 60, 3)
    assert (local["gaps"], local["gap_mean"]) == (1, 1.0)  # measured by the metrics observer
    shares = charts["tenants"]
    assert shares["total"] == 29.0
    assert [(s["name"], s["seconds"]) for s in shares["shares"]] == [
        ("alice", 17.0),
        ("bob", 12.0),
    ]
    assert shares["shares"][0]["share"] == round(17 / 29, 4)

    [failure] = fleet.watch.failures
    assert (failure["id"], failure["tenant"], failure["lane"]) == ("b", "bob", "local")
    assert failure["node_type"] == "Fail" and len(failure["message"]) == 300

    # A tenant's page gets the lanes only: the other charts count every tenant's prompts.
    tenant = fleet.watch.charts.charts(admin=False)
    assert tenant["lanes"] == charts["lanes"]
    assert tenant["throughput"] is tenant["queue"] is tenant["tenants"] is None


def test_a_prompt_runs_from_its_first_event_and_a_requeued_one_ends_uncounted(
    scheduler: Scheduler,
) -> None:
    fleet = Fleet(scheduler)
    # Prefetched into a backend's queue at 1 (a lane the scheduler no longer has), its
    # first event at 9: it ran from 9.
    waiting = fleet.at(1).start(job("w", "bob", lane="backend:gone"))
    given_back = fleet.start(job("g", "alice"))
    fleet.at(2).event(given_back)
    fleet.at(6).observers.job_stopped(given_back)  # back to the queue: ran 4 s, no end
    fleet.at(9).event(waiting)
    fleet.at(9.5).observers.job_stopped(waiting)
    charts = fleet.at(10).watch.charts.charts(admin=True)
    assert charts["throughput"]["totals"] == {"completed": 0, "failed": 0, "stopped": 0}
    lanes = {lane["name"]: lane for lane in charts["lanes"]}
    assert lanes["local"]["utilization"] == [0.2]  # 4 of 2 x 10 slot-seconds
    assert lanes["backend:gone"]["utilization"] == [None]  # its slots are not known
    assert [(s["name"], s["seconds"]) for s in charts["tenants"]["shares"]] == [
        ("alice", 4.0),
        ("bob", 0.5),
    ]


def test_intervals_with_nothing_told_are_closed_when_asked(scheduler: Scheduler) -> None:
    fleet = Fleet(scheduler)
    long = fleet.at(5).start(job("long", "alice"))
    fleet.event(long)
    charts = fleet.at(95).watch.charts.charts(admin=True)  # nothing told for 90 s
    [local] = charts["lanes"]
    assert local["utilization"] == [0.25] + [0.5] * 8  # one slot of two, from 5 on
    assert charts["seq"] == 9 and charts["age"] == 5.0
    # Hours later: the ring holds the last hour only, each sample the prompt running.
    charts = fleet.at(95 + 3 * 3600).watch.charts.charts(admin=True)
    assert charts["samples"] == KEEP and len(fleet.watch.charts.samples) == KEEP
    assert set(charts["lanes"][0]["utilization"]) == {0.5}
    assert charts["tenants"]["total"] == KEEP * 10.0


def test_memory_and_series_stay_bounded_whatever_the_load(scheduler: Scheduler) -> None:
    fleet = Fleet(scheduler)
    prompts = 0
    for second in range(0, 2 * 3600, 2):  # two hours, a new lane and tenant every prompt
        for _ in range(6):
            prompts += 1
            lane, tenant = f"backend:{prompts}{'<b>' * 40}", f"tenant-{prompts}"
            started = fleet.at(second).start(job(f"p{prompts}", tenant, second, lane))
            fleet.event(started)
            fleet.at(second + 1).observers.job_finished(started, DONE)
    charts = fleet.watch.charts
    assert len(charts.samples) == KEEP
    assert len(charts._runs) == 0  # every prompt that ended is forgotten
    for sample in charts.samples:
        assert len(sample.lanes) <= LANES_KEPT + 1 and len(sample.tenants) <= TENANTS_KEPT + 1
        assert all(lane.name is None or len(lane.name) <= 100 for lane in sample.lanes)
        assert sample.completed == 30 and sample.busy == pytest.approx(30.0)
        assert sum(busy for _, busy in sample.tenants) == pytest.approx(30.0)
        assert sum(lane.busy for lane in sample.lanes) == pytest.approx(30.0)
    drawn = charts.charts(admin=True)
    assert len(drawn["lanes"]) == LANES_SHOWN + 1 and drawn["lanes"][-1]["name"] is None
    assert len(drawn["tenants"]["shares"]) == TENANTS_SHOWN + 1
    assert drawn["tenants"]["shares"][-1]["name"] is None
    assert sum(s["share"] for s in drawn["tenants"]["shares"]) == pytest.approx(1.0, abs=1e-3)

    # One interval with more names than an interval sums apart: the rest go to "other".
    for n in range(MAX_OPEN + 500):
        started = fleet.at(7300).start(job(f"q{n}", f"many-{n}", 7300, f"lane-{n}"))
        fleet.event(started)
        fleet.at(7301).observers.job_finished(started, DONE)
    assert len(charts._open.tenant_busy) <= MAX_OPEN + 1
    assert len(charts._open.lane_busy) <= MAX_OPEN + 1
    last = fleet.at(7310).watch.charts.charts(admin=True)
    assert last["throughput"]["completed"][-1] == (MAX_OPEN + 500) * 6
    sample = charts.samples[-1]
    assert len(sample.tenants) == TENANTS_KEPT + 1
    assert sum(busy for _, busy in sample.tenants) == pytest.approx(MAX_OPEN + 500)


async def test_a_real_schedulers_prompts_are_counted_as_they_ran(tmp_path: Path) -> None:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    scheduler = Scheduler(store, [LocalLane(engine, 1)])
    watch = FleetWatch(scheduler, step=0.5)
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    metrics.idle_gap_listeners.append(watch.charts.idle_gap)
    scheduler.observers.add(watch)
    scheduler.observers.add(metrics)
    await scheduler.start()
    began = time.monotonic()
    try:
        for tag in range(3):  # one runs, two wait (each its own: none from the cache)
            new = NewJob(str(uuid.uuid4()), 0, False, sleep_prompt(0.3, tag), {}, ["3"])
            await scheduler.submit(replace(new, tenant="alice"))
        while len(watch.finished) < 3:
            assert time.monotonic() - began < 20
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)  # the interval of the last end closes
    finally:
        await scheduler.stop(grace=0.0)
        await store.close()
        engine.close()
    charts = watch.charts.charts(admin=True)
    samples = list(watch.charts.samples)
    assert sum(s.completed for s in samples) == 3
    assert 2 <= max(s.peak for s in samples) <= 3  # two waited while the first ran
    ran = sum(s.busy for s in samples)
    assert 0.85 <= ran <= 0.3 * 3 + 0.5  # 0.3 s each, and what the engine adds
    [local] = charts["lanes"]
    assert local["name"] == "local" and local["gaps"] == registry.get_sample_value(
        "comfyfleet_lane_idle_gap_seconds_count", {"lane": "local"}
    )
    assert charts["tenants"]["shares"][0]["name"] == "alice"
    assert charts["tenants"]["shares"][0]["share"] == 1.0
