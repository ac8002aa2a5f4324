"""The fleet dashboard (`/fleet`): what runs where, the queue, recent outputs, collectors,
and charts of the last hour.

`FleetWatch` observes every job event the router routes and keeps what the store does
not: each running prompt's progress, the last finished prompts, the last failures, their
output images and collectors' reports, and the charts' samples (charts.py). `snapshot`
puts that together with the fleet's and the scheduler's state and one store read (the
head of the queue). The charts change once per sample: a snapshot carries only their
sequence number, and a page reads them (`GET /api/fleet/charts`) when it moves.

Dashboards get snapshots, never events. `DashboardFeed` builds at most one snapshot per
view (tenant, admin or not) every TICK seconds when something changed, and one every
IDLE_TICK seconds anyway (wait times grow, backends come and go without events); a
dashboard still receiving the previous snapshot skips the next one. So a page can never
fall behind, and 100 prompts a second cost the server a few snapshots a second, not
thousands of frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.fanout.status import slot_entry
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.access.auth import request_tenant, scope, tenant_name
from comfyfleet.server.admin.fleet_api import backend_state, tenants_json
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.jobs_api.jobs import API_STATUS, parent_of
from comfyfleet.server.pages.charts import STEP, Samples
from comfyfleet.server.plumbing.routing import Route

log = logging.getLogger(__name__)

TICK = 0.25
IDLE_TICK = 1.0
MAX_RECENT = 50
MAX_OUTPUTS = 48
MAX_REPORTS = 5
MAX_PENDING_SHOWN = 50
MAX_FAILURES = 20
MAX_FAILURES_SHOWN = 10
MAX_MESSAGE = 300  # characters kept of a failure's message
PAGE_DIR = Path(__file__).parent / "web" / "fleet"


@dataclass
class _Progress:
    node: str | None = None
    value: float = 0.0
    max: float = 0.0
    started: bool = False  # an event came: it runs (else it waits in a backend's queue)


@dataclass(frozen=True)
class Viewer:
    scope: str | None  # the tenant whose jobs it sees; None: all
    tenant: str  # whose files it can show
    admin: bool


class FleetWatch(JobObserver):
    """Told of every job event (a scheduler observer); keeps the dashboard's live state.

    `scheduler`'s lanes and pending count are read when a chart sample closes."""

    def __init__(
        self,
        scheduler: Scheduler,
        clock: Callable[[], float] = time.monotonic,
        step: float = STEP,
    ) -> None:
        self.charts = Samples(
            lambda: [(lane.name, lane.runs_at_once) for lane in scheduler.lanes],
            lambda: scheduler.pending,
            clock=clock,
            step=step,
        )
        self.progress: dict[str, _Progress] = {}
        self.finished: deque[dict[str, Any]] = deque(maxlen=MAX_RECENT)
        self.failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        self.outputs: deque[dict[str, Any]] = deque(maxlen=MAX_OUTPUTS)
        self.reports: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTS)
        self.totals: Counter[tuple[str, str]] = Counter()  # (tenant, status) since start
        self.version = 0

    def job_started(self, job: Job) -> None:
        self.charts.started(job.prompt_id, job.lane or "unknown", job.tenant)

    def job_event(self, job: Job, event: EngineEvent) -> None:
        if not isinstance(event, Message):
            return
        self.charts.running(job.prompt_id)
        progress = self.progress.setdefault(job.prompt_id, _Progress())
        progress.started = True
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "progress":
            progress.node = str(data.get("node"))
            progress.value, progress.max = _number(data.get("value")), _number(data.get("max"))
        elif event.type == "executing" and data.get("node") is not None:
            progress.node, progress.value, progress.max = str(data["node"]), 0.0, 0.0
        elif event.type == "executed":
            self._outputs(job, data.get("output"))
        self.version += 1

    def _outputs(self, job: Job, output: Any) -> None:
        if not isinstance(output, dict):
            return
        for image in output.get("images") or []:
            if isinstance(image, dict) and isinstance(image.get("filename"), str):
                keep = {k: str(image.get(k, "")) for k in ("filename", "subfolder", "type")}
                self.outputs.appendleft({"prompt_id": job.prompt_id, "tenant": job.tenant, **keep})
        for text in output.get("text") or []:
            if isinstance(text, str) and text.startswith('{"collector"'):
                with contextlib.suppress(ValueError):
                    report = json.loads(text)
                    self.reports.appendleft(
                        {"prompt_id": job.prompt_id, "tenant": job.tenant, "report": report}
                    )

    def job_finished(self, job: Job, result: JobResult) -> None:
        status = result.status
        self.progress.pop(job.prompt_id, None)
        now = time.time()
        self.finished.appendleft(
            {
                "id": job.prompt_id,
                "tenant": job.tenant,
                "status": API_STATUS[status],
                "lane": job.lane,
                "parent": parent_of(job.extra_data),
                "finished": now,
                "seconds": round(now - (job.started_at or job.created_at), 3),
            }
        )
        if status == JobStatus.ERROR:
            self.failures.appendleft(_failure(job, result, now))
        self.totals[(job.tenant, API_STATUS[status])] += 1
        self.charts.ended(job.prompt_id, status)
        self.version += 1

    def job_stopped(self, job: Job) -> None:
        self.progress.pop(job.prompt_id, None)
        self.charts.ended(job.prompt_id, None)
        self.version += 1

    def queue_changed(self, remaining: int) -> None:
        self.charts.queue_changed()
        self.version += 1


def _failure(job: Job, result: JobResult, now: float) -> dict[str, Any]:
    """A failed prompt as the page lists it: where and why, its message cut short."""
    error = result.error or job.error or {}

    def text(key: str, limit: int = 100) -> str | None:
        value = error.get(key)
        return None if value is None else str(value).strip()[:limit]

    return {
        "id": job.prompt_id,
        "tenant": job.tenant,
        "lane": job.lane,
        "finished": now,
        "node_id": text("node_id"),
        "node_type": text("node_type"),
        "exception_type": text("exception_type"),
        "message": text("exception_message", MAX_MESSAGE),
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


# ---------------------------------------------------------------- the snapshot


def _visible(view: Viewer, tenant: str) -> bool:
    return view.scope is None or view.scope == tenant


def _running(gw: Gateway, watch: FleetWatch, view: Viewer, now: float) -> list[dict[str, Any]]:
    out = []
    local = gw.fleet.local.name if gw.fleet.local is not None else None
    for job in gw.scheduler.running_jobs():
        if not _visible(view, job.tenant):
            continue
        progress = watch.progress.get(job.prompt_id, _Progress())
        entry: dict[str, Any] = {
            "id": job.prompt_id,
            "parent": parent_of(job.extra_data),
            "lane": job.lane,
            # A backend's prompt may wait in its queue (prefetch) until its first event.
            "state": "running" if progress.started or job.lane == local else "sent",
            "seconds": round(now - (job.started_at or now), 1),
            "node": progress.node,
            "value": progress.value,
            "max": progress.max,
            "own": job.tenant == view.tenant,
        }
        if view.admin:
            entry["tenant"] = job.tenant
        out.append(entry)
    return out


def _lanes(gw: Gateway, running: list[dict[str, Any]], view: Viewer) -> list[dict[str, Any]]:
    lanes: list[dict[str, Any]] = []
    if gw.fleet.local is not None:
        local = gw.fleet.local
        lanes.append({"name": local.name, "kind": "local", "state": "up", "slots": local.slots})
    for lane in gw.fleet.backends.values():
        entry: dict[str, Any] = {
            "name": lane.name,
            "backend": lane.spec.name,
            "kind": "backend",
            "state": backend_state(gw, lane),
            "suspect": lane.suspect,
            "slots": lane.runs_at_once,
            "prefetch": lane.spec.prefetch,
        }
        if lane.worker is not None:
            entry["kind"] = "worker"
            entry["worker"] = {
                "state": lane.worker.state,
                "seen_at": lane.worker.seen_at,
                "machine": lane.worker.machine,
            }
            entry["node_classes"] = len(lane.capabilities.object_info)
            if view.admin:
                entry["worker"]["address"] = lane.worker.address
        set_aside = gw.scheduler.reserved_for(lane.name)
        entry["set_aside_count"] = len(set_aside)
        if view.admin:
            entry["url"] = lane.spec.url
            entry["set_aside"] = set_aside
        lanes.append(entry)
    for entry in lanes:
        mine = [r for r in running if r["lane"] == entry["name"]]
        entry["running"] = [r["id"] for r in mine if r["state"] == "running"]
        entry["prefetched"] = [r["id"] for r in mine if r["state"] == "sent"]
    return lanes


def _collectors(gw: Gateway, watch: FleetWatch, view: Viewer) -> list[dict[str, Any]]:
    redactor = gw.fanout.vault.redactor()
    out = []
    for (prompt_id, node_id), (mode, slots) in list(gw.fanout.collecting.items()):
        job = gw.scheduler.running_job(prompt_id)
        if job is None or not _visible(view, job.tenant):
            continue
        entries = [slot_entry(n, task, redactor) for n, task in enumerate(slots, 1) if task]
        out.append(
            {"prompt_id": prompt_id, "node": node_id, "mode": mode, "live": True, "slots": entries}
        )
    for item in watch.reports:
        if _visible(view, item["tenant"]):
            report = item["report"]
            slots = [s for s in report.get("slots", []) if s.get("state") != "not_connected"]
            out.append(
                {
                    "prompt_id": item["prompt_id"],
                    "node": report.get("collector"),
                    "mode": report.get("failure_mode"),
                    "live": False,
                    "slots": slots,
                }
            )
    return out


async def snapshot(gw: Gateway, watch: FleetWatch, view: Viewer) -> dict[str, Any]:
    now = time.time()
    pending, total = await gw.store.jobs(
        statuses=[JobStatus.PENDING],
        newest_first=False,
        limit=MAX_PENDING_SHOWN,
        tenant=view.scope,
    )
    watch.charts.roll()  # intervals that ended while nothing happened
    running = _running(gw, watch, view, now)
    totals: Counter[str] = Counter()
    for (tenant, status), count in watch.totals.items():
        if _visible(view, tenant):
            totals[status] += count
    return {
        "time": now,
        "tenant": view.tenant,
        "admin": view.admin,
        "lanes": _lanes(gw, running, view),
        "queue": {
            "pending": total,
            "running": len(running),
            "finished": dict(totals),
            "head": [_pending(job, now, view) for job in pending],
        },
        "running": running,
        "recent": [f for f in watch.finished if _visible(view, f["tenant"])][:20],
        "failures": [f for f in watch.failures if _visible(view, f["tenant"])][:MAX_FAILURES_SHOWN],
        "charts": watch.charts.seq,  # the charts' newest sample: read them when it moves
        "outputs": [o for o in watch.outputs if o["tenant"] == view.tenant][:24],
        "collectors": _collectors(gw, watch, view),
        "tenants": await tenants_json(
            gw, [s for s in await gw.scheduler.shares.current() if _visible(view, s.tenant)]
        ),
    }


def _pending(job: Job, now: float, view: Viewer) -> dict[str, Any]:
    return {
        "id": job.prompt_id,
        "own": job.tenant == view.tenant,
        "number": job.number,
        "front": job.front,
        "wait": round(now - job.created_at, 1),
        "set_aside_for": job.lane,
    }


# ---------------------------------------------------------------- delivery


@dataclass(eq=False)
class _Dashboard:
    ws: web.WebSocketResponse
    view: Viewer
    sending: asyncio.Task[None] | None = None


@dataclass
class DashboardFeed:
    """Sends snapshots to every open dashboard (see the module's docstring)."""

    gw: Gateway
    watch: FleetWatch
    tick: float = TICK
    idle_tick: float = IDLE_TICK
    _open: set[_Dashboard] = field(default_factory=set)
    _loop: asyncio.Task[None] | None = None
    sent: int = 0  # snapshots sent, for the curious (and the benchmark)

    def open(self, dashboard: _Dashboard) -> None:
        self._open.add(dashboard)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="fleet-dashboards")

    def close(self, dashboard: _Dashboard) -> None:
        self._open.discard(dashboard)
        if dashboard.sending is not None:
            dashboard.sending.cancel()

    async def stop(self) -> None:
        for dashboard in list(self._open):
            await dashboard.ws.close()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop

    async def _run(self) -> None:
        seen, last = -1, 0.0
        while self._open:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            if self.watch.version == seen and now - last < self.idle_tick:
                continue
            seen, last = self.watch.version, now
            try:
                await self._send_all()
            except Exception:  # a failed store read: the next tick tries again
                log.exception("could not build the fleet dashboard's snapshot")

    async def _send_all(self) -> None:
        views: dict[Viewer, list[_Dashboard]] = {}
        for dashboard in list(self._open):
            if dashboard.sending is None or dashboard.sending.done():
                views.setdefault(dashboard.view, []).append(dashboard)
        for view, dashboards in views.items():
            text = json.dumps(await snapshot(self.gw, self.watch, view))
            for dashboard in dashboards:
                dashboard.sending = asyncio.create_task(self._send(dashboard, text))

    async def _send(self, dashboard: _Dashboard, text: str) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await dashboard.ws.send_str(text)
            self.sent += 1


def _file(name: str, kind: str) -> web.FileResponse:
    return web.FileResponse(
        PAGE_DIR / name, headers={"Content-Type": kind, "Cache-Control": "no-cache"}
    )


def viewer_of(request: web.Request) -> Viewer:
    """An admin watches the whole fleet, every tenant's prompts included; any other token
    its own tenant's. Either sees only its own tenant's files."""
    tenant = request_tenant(request)
    admin = tenant is None or tenant.admin
    return Viewer(None if admin else scope(request), tenant_name(request), admin)


def dashboard_routes(feed: DashboardFeed) -> list[Route]:
    async def page(request: web.Request) -> web.StreamResponse:
        return _file("fleet.html", "text/html")

    async def script(request: web.Request) -> web.StreamResponse:
        return _file("fleet.js", "application/javascript")

    async def chart_script(request: web.Request) -> web.StreamResponse:
        return _file("charts.js", "application/javascript")

    async def status(request: web.Request) -> web.StreamResponse:
        gw = request.app[GATEWAY]
        return web.json_response(await snapshot(gw, feed.watch, viewer_of(request)))

    async def charts(request: web.Request) -> web.StreamResponse:
        return web.json_response(feed.watch.charts.charts(viewer_of(request).admin))

    async def live(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(compress=False, max_msg_size=1024)
        await ws.prepare(request)
        dashboard = _Dashboard(ws, viewer_of(request))
        await ws.send_str(json.dumps(await snapshot(feed.gw, feed.watch, dashboard.view)))
        feed.open(dashboard)
        try:
            async for message in ws:
                if message.type == WSMsgType.ERROR:
                    break  # what a dashboard sends means nothing
        finally:
            feed.close(dashboard)
        return ws

    return [
        Route("GET", "/fleet", page, api_alias=False, page=True),
        Route("GET", "/fleet/fleet.js", script, api_alias=False),
        Route("GET", "/fleet/charts.js", chart_script, api_alias=False),
        Route("GET", "/api/fleet/status", status),
        Route("GET", "/api/fleet/charts", charts),
        Route("GET", "/api/fleet/ws", live),
    ]
