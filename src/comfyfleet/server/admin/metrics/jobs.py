"""What happens to jobs over time, counted as the scheduler tells it (a job observer).

The idle gap of a lane is the time it had nothing running while work waited for it:
when a job starts on a lane that had nothing running, from the later of the lane's
last end and the moment the job became ready (queued, or given back), to its start.
A lane of several slots (the built-in engine's) counts as idle only with every slot
free. A slot handed a job the moment it is queued shows a gap near zero; a lane
left idle with nothing queued shows none at all. Each gap is measured here once and
also handed to `idle_gap_listeners` (the dashboard's charts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.server.admin.metrics.labels import BoundedLabel, Children

#: Distinct lanes and tenants given their own series; the rest are `other`.
MAX_LANES = 200
MAX_TENANTS = 200
#: Re-queued jobs whose ready time is remembered until they start again.
MAX_WAITING = 100_000

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
GAP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Why a job goes back to the queue (the scheduler's reason kinds; None at shutdown).
REQUEUE_REASONS = ("lane", "node_error", "taken_back", "orphaned", "shutdown")


@dataclass
class _Lane:
    running: int = 0
    idle_since: float | None = None  # when its last job ended; None before any


class JobMetrics(JobObserver):
    """Counters and histograms of jobs, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # the store's clock: jobs' created_at and started_at come from it
        self._lane = BoundedLabel(MAX_LANES)
        self._tenant = BoundedLabel(MAX_TENANTS)
        self._reason = BoundedLabel(len(REQUEUE_REASONS) + 8)
        self._lanes: dict[str, _Lane] = {}
        self._on_lane: dict[str, str] = {}  # prompt id -> the lane its attempt runs on
        self._ready: dict[str, float] = {}  # prompt id -> when it was given back
        #: Told of each idle gap measured: (lane name, seconds), on the event loop.
        self.idle_gap_listeners: list[Callable[[str, float], None]] = []
        self.submitted = Counter(
            "comfyfleet_jobs_submitted",
            "Prompts queued, by tenant.",
            ["tenant"],
            registry=registry,
        )
        self.finished = Counter(
            "comfyfleet_jobs_finished",
            "Prompts ended, by final status (success, error, interrupted, cancelled) and "
            "tenant. A prompt deleted from the queue before it started is not counted.",
            ["status", "tenant"],
            registry=registry,
        )
        self.attempts = Counter(
            "comfyfleet_job_attempts",
            "Attempts started, by lane (a re-queued prompt starts another).",
            ["lane"],
            registry=registry,
        )
        self.requeues = Counter(
            "comfyfleet_job_requeues",
            "Attempts given back to the queue, by reason: lane (the lane failed), "
            "node_error (an error that may be the lane's, tried elsewhere), taken_back "
            "(moved from a backend's queue to a free slot), orphaned (its gateway's lease "
            "ran out), shutdown.",
            ["reason"],
            registry=registry,
        )
        for reason in REQUEUE_REASONS:
            self.requeues.labels(self._reason(reason))
        self.queue_wait = Histogram(
            "comfyfleet_queue_wait_seconds",
            "Time from a prompt's submission to its first start.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.run_time = Histogram(
            "comfyfleet_job_run_seconds",
            "Time from a prompt's last start to its end, by the lane it ended on.",
            ["lane"],
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.idle_gap = Histogram(
            "comfyfleet_lane_idle_gap_seconds",
            "Time a lane had nothing running while a prompt it then started was waiting.",
            ["lane"],
            buckets=GAP_BUCKETS,
            registry=registry,
        )

        self._submitted = Children(self.submitted)
        self._finished = Children(self.finished)
        self._attempts = Children(self.attempts)
        self._run_time = Children(self.run_time)
        self._idle_gap = Children(self.idle_gap)

    def job_submitted(self, job: Job) -> None:
        self._submitted(self._tenant(job.tenant)).inc()

    def job_started(self, job: Job) -> None:
        now = self._clock()
        lane_name = job.lane or "unknown"
        lane = self._lanes.setdefault(lane_name, _Lane())
        ready = self._ready.pop(job.prompt_id, job.created_at)
        gap = None
        if lane.running == 0 and lane.idle_since is not None:
            gap = max(0.0, now - max(lane.idle_since, ready))
            self._idle_gap(self._lane(lane_name)).observe(gap)
        lane.running += 1
        self._on_lane[job.prompt_id] = lane_name
        self._attempts(self._lane(lane_name)).inc()
        if job.attempt == 1:
            started = job.started_at if job.started_at is not None else now
            self.queue_wait.observe(max(0.0, started - job.created_at))
        if gap is not None:  # last: the counts above are kept whatever a listener does
            for listener in self.idle_gap_listeners:
                listener(lane_name, gap)

    def job_requeued(self, job: Job, reason: dict[str, Any] | None) -> None:
        kind = "shutdown" if reason is None else str(reason.get("kind", "unknown"))
        self.requeues.labels(self._reason(kind)).inc()
        if len(self._ready) >= MAX_WAITING:  # cancelled while queued: never started again
            del self._ready[next(iter(self._ready))]
        self._ready[job.prompt_id] = self._clock()

    def job_finished(self, job: Job, result: JobResult) -> None:
        self._finished(result.status.value, self._tenant(job.tenant)).inc()
        if job.started_at is not None:
            seconds = max(0.0, self._clock() - job.started_at)
            self._run_time(self._lane(job.lane or "unknown")).observe(seconds)
        self._ended(job)

    def job_stopped(self, job: Job) -> None:
        self._ended(job)

    def _ended(self, job: Job) -> None:
        lane_name = self._on_lane.pop(job.prompt_id, None)
        lane = self._lanes.get(lane_name) if lane_name is not None else None
        if lane is None:
            return
        lane.running = max(0, lane.running - 1)
        if lane.running == 0:
            lane.idle_since = self._clock()
