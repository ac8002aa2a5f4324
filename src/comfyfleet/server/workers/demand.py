"""How many workers the queue wants: `GET /api/fleet/demand` and its gauges, what an
autoscaler (a KEDA ScaledObject, a script) reads to add or remove workers.

    slots wanted   = running + pending x (seconds a prompt runs) / (target wait)
    workers wanted = what the slots wanted exceed the other lanes' slots by, in
                     workers (each with the mean slots of the connected ones, else 1)

The seconds a prompt runs are the mean of the prompts that ended here lately (weighted
towards the newest); before any ended it is unknown and nothing is wanted but what
runs. The queue's counts are the store's (every gateway's, on PostgreSQL).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.server.gateway import Gateway
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.server.workers.hub import WorkerHub

DEFAULT_TARGET_WAIT = 60.0  # s: what the gauges assume
#: The oldest pending prompts looked at for what they need; each kind of need listed.
SCANNED, KINDS, CLASSES_LISTED = 200, 20, 50
MAX_TARGET_WAIT = 86400.0
WEIGHT = 0.1  # of each new run time in the mean


class RunTimes(JobObserver):
    """The mean time prompts ran here lately (an exponentially weighted mean)."""

    def __init__(self) -> None:
        self.mean: float | None = None

    def job_finished(self, job: Job, result: JobResult) -> None:
        if job.started_at is None:
            return
        seconds = max(0.0, time.time() - job.started_at)
        self.mean = seconds if self.mean is None else self.mean + WEIGHT * (seconds - self.mean)


@dataclass(frozen=True)
class Wanted:
    slots: int | None
    workers: int | None


class Demand:
    def __init__(self, gateway: Gateway, hub: WorkerHub) -> None:
        self.gw = gateway
        self.hub = hub
        self.run_times = RunTimes()
        gateway.scheduler.observers.add(self.run_times)

    def wanted(self, pending: int, running: int, target_wait: float) -> Wanted:
        per_prompt = self.run_times.mean
        if per_prompt is None:
            return Wanted(None, None)
        slots = math.ceil(running + pending * per_prompt / target_wait)
        workers = [w for w in self.hub.workers.values() if w.ws is not None]
        worker_slots = sum(w.lane.spec.slots for w in workers)
        other = sum(lane.slots for lane in self.gw.scheduler.lanes) - worker_slots
        each = worker_slots / len(workers) if workers else 1.0
        return Wanted(slots, max(0, math.ceil((slots - other) / each)))

    async def report(self, target_wait: float) -> dict[str, Any]:
        counts = await self.gw.store.counts()
        pending = counts.get(JobStatus.PENDING, 0)
        running = counts.get(JobStatus.RUNNING, 0)
        wanted = self.wanted(pending, running, target_wait)
        workers = self.hub.status()
        lanes = self.gw.scheduler.lanes
        busy = sum(len(self.gw.scheduler.runs_on(lane.name)) for lane in lanes)
        mean = self.run_times.mean
        return {
            "pending": pending,
            "running": running,
            "slots": {"total": sum(lane.slots for lane in lanes), "busy": busy},
            "workers": {
                "connected": sum(1 for w in workers if w["state"] == "connected"),
                "idle": sum(1 for w in workers if w["state"] == "connected" and not w["running"]),
                "draining": sum(1 for w in workers if w["state"] == "draining"),
            },
            "needs": await self._needs(),
            "seconds_per_prompt": None if mean is None else round(mean, 3),
            "target_wait": target_wait,
            "slots_wanted": wanted.slots,
            "workers_wanted": wanted.workers,
        }

    async def _needs(self) -> list[dict[str, Any]]:
        """The oldest pending prompts grouped by the node classes they need that the
        gateway's own engine lacks (what a worker must bring), most wanted first."""
        jobs, _total = await self.gw.store.jobs(
            statuses=[JobStatus.PENDING], newest_first=False, limit=SCANNED
        )
        # In a thread: prompts may have thousands of nodes each.
        return await asyncio.to_thread(_grouped, jobs, self.gw.fleet.engine.registry)

    def gauges(self, counts: Mapping[JobStatus, int]) -> Iterator[Metric]:
        """For /metrics, from the store's counts of the scrape."""
        workers = GaugeMetricFamily(
            "comfyfleet_workers",
            "Workers of this gateway by state (connected, draining, away: disconnected, "
            "its lane kept a while).",
            labels=["state"],
        )
        states = Counter(w["state"] for w in self.hub.status())
        for state in ("connected", "draining", "away"):
            workers.add_metric([state], states[state])
        wanted = GaugeMetricFamily(
            "comfyfleet_workers_wanted",
            f"Workers the queue wants for a {DEFAULT_TARGET_WAIT:g} s wait "
            "(GET /api/fleet/demand); no sample until a prompt ran here.",
        )
        pending = counts.get(JobStatus.PENDING, 0)
        running = counts.get(JobStatus.RUNNING, 0)
        estimate = self.wanted(pending, running, DEFAULT_TARGET_WAIT).workers
        if estimate is not None:
            wanted.add_metric([], estimate)
        yield from (workers, wanted)

    def routes(self) -> list[Route]:
        async def demand(request: web.Request) -> web.Response:
            try:
                target = float(request.query.get("target_wait", DEFAULT_TARGET_WAIT))
            except ValueError:
                target = math.nan
            if not 1.0 <= target <= MAX_TARGET_WAIT:  # NaN too
                error = {
                    "type": "invalid_query",
                    "message": f"target_wait must be 1 to {MAX_TARGET_WAIT:g} seconds",
                    "details": "",
                    "extra_info": {},
                }
                return web.json_response({"error": error}, status=400)
            return web.json_response(await self.report(target))

        return [Route("GET", "/api/fleet/demand", demand, admin=True)]


def _grouped(jobs: list[Job], local: NodeRegistry) -> list[dict[str, Any]]:
    kinds: Counter[tuple[str, ...]] = Counter()
    for job in jobs:
        classes = {str(node.get("class_type")) for node in job.prompt.values()}
        kinds[tuple(sorted(c for c in classes if c not in local))] += 1
    return [
        {"classes": list(classes[:CLASSES_LISTED]), "pending": count}
        for classes, count in kinds.most_common(KINDS)
    ]
