"""The job observer's idle gap: the time a lane had nothing running while the prompt it
then started was waiting (real observer, real registry, a clock the test moves)."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.server.admin.metrics.jobs import JobMetrics
from tests.helpers import FakeTime

DONE = JobResult(JobStatus.SUCCESS, {}, {}, [])


def job(prompt_id: str, created: float, lane: str = "local") -> Job:
    return Job(prompt_id, 0, False, 1, {}, {}, [], None, JobStatus.RUNNING, 1, lane, created)


def gaps(registry: CollectorRegistry, lane: str = "local") -> tuple[float, float]:
    labels = {"lane": lane}
    count = registry.get_sample_value("comfyfleet_lane_idle_gap_seconds_count", labels)
    total = registry.get_sample_value("comfyfleet_lane_idle_gap_seconds_sum", labels)
    return (count or 0.0, total or 0.0)


def test_idle_gaps_count_only_the_time_work_waited() -> None:
    clock, registry = FakeTime(), CollectorRegistry()
    metrics = JobMetrics(registry, clock.clock)

    def at(now: float) -> None:
        clock.now = now

    first = job("a", created=0.0)
    at(1.0)
    metrics.job_started(replace(first, started_at=1.0))
    assert gaps(registry) == (0, 0)  # never idle before
    at(2.0)
    metrics.job_finished(replace(first, started_at=1.0), DONE)  # idle from 2

    waiting = job("b", created=1.5)  # queued while the lane was busy
    at(5.0)
    metrics.job_started(waiting)
    assert gaps(registry) == (1, 3.0)  # idle from 2 to 5 with b waiting
    at(6.0)
    metrics.job_stopped(waiting)

    later = job("c", created=10.0)  # nothing waited from 6 to 10
    at(10.5)
    metrics.job_started(later)
    assert gaps(registry) == (2, 3.5)
    at(11.0)
    metrics.job_requeued(later, {"kind": "lane", "lane": "local"})  # ready again at 11
    metrics.job_stopped(later)
    at(13.0)
    metrics.job_started(replace(later, attempt=2))
    assert gaps(registry) == (3, 5.5)
    assert registry.get_sample_value("comfyfleet_queue_wait_seconds_count") == 3  # a, b, c
    assert registry.get_sample_value("comfyfleet_job_requeues_total", {"reason": "lane"}) == 1


def test_a_lane_with_a_slot_still_busy_is_not_idle() -> None:
    clock, registry = FakeTime(), CollectorRegistry()
    metrics = JobMetrics(registry, clock.clock)
    one, two, three = job("1", 0.0), job("2", 0.0), job("3", 0.0)
    metrics.job_started(one)
    metrics.job_finished(one, DONE)
    clock.now = 1.0
    metrics.job_started(two)
    metrics.job_started(three)  # the lane was busy with two
    clock.now = 2.0
    metrics.job_finished(two, DONE)
    assert gaps(registry) == (1, 1.0)  # only two's start found the lane idle
