"""`GET /api/v2/jobs/{id}/events`: a job's live events as v2's Server-Sent Events.

v2's stream is live, with no replay cursor (no `id:` lines; a client that reconnects
gets a fresh snapshot): first a `status` event (the job's state now), then `progress`
(a whole snapshot each: nodes done of the graph's, the running node's steps),
`preview` (a node's preview image, base64) and `output` (each file a node saves, as
the job's Output objects name it), and last the terminal `status`, after which the
stream ends. Every output comes before the terminal status: the SDK stops reading there.

Built on the event log (delivery/event_log.py), so a job running on another gateway of
the store streams too. The store's job record is the authority on the state: it is read
once a second besides, so a job cancelled while queued (which logs no events) or a log
that is off (`events_retention = 0`) still ends its stream promptly. Previews and
progress are sent at most a few times a second.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from comfyfleet.domain.jobs import TERMINAL, Job
from comfyfleet.domain.prompt_events import PromptEvent
from comfyfleet.engine.events import PreviewImage
from comfyfleet.errors import ComfyfleetError
from comfyfleet.server.comfy_api_v2 import shapes
from comfyfleet.server.comfy_api_v2.errors import PREFIX, V2Error
from comfyfleet.server.comfy_api_v2.jobs import base_url, folders_of, own_job
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.plumbing.routing import Route

#: Seconds between reads of the job's record while its log is quiet.
CHECK_EVERY = 1.0
#: Seconds between SSE comments on a quiet stream.
KEEP_ALIVE = 15.0
#: Least seconds between two `progress` events, and between two `preview` events.
PROGRESS_EVERY = 0.25
PREVIEW_EVERY = 0.5
#: Streams one gateway serves at once; beyond, 429 `too_many_streams` (poll instead).
MAX_STREAMS = 256


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def status_event(job: Job) -> dict[str, Any]:
    return {"status": shapes.V2_STATUS[job.status], "queue_position": None}


class _Progress:
    """The whole-snapshot progress of one job, from its ComfyUI events."""

    def __init__(self, job: Job) -> None:
        self.total = max(1, len(job.prompt))
        self.done: set[str] = set()
        self.node: str | None = None
        self.kinds = {k: v.get("class_type") for k, v in job.prompt.items() if isinstance(v, dict)}
        self.step: int | None = None
        self.steps: int | None = None

    def apply(self, kind: str, data: dict[str, Any]) -> bool:
        """Take one event; whether the snapshot changed."""
        if kind == "executing":
            if self.node is not None:
                self.done.add(self.node)
            node = data.get("node")
            self.node = None if node is None else str(node)
            self.step = self.steps = None
        elif kind == "execution_cached":
            self.done.update(str(n) for n in data.get("nodes") or [] if isinstance(n, str | int))
        elif kind == "executed":
            self.done.add(str(data.get("node")))
        elif kind == "progress":
            value, most = data.get("value"), data.get("max")
            if not isinstance(value, int | float) or not isinstance(most, int | float):
                return False
            self.step, self.steps = int(value), int(most)
        else:
            return False
        return True

    def snapshot(self) -> dict[str, Any]:
        done = len(self.done)
        part = self.step / self.steps if self.step is not None and self.steps else 0.0
        value = min(1.0, max(0.0, (done + (part if self.node else 0.0)) / self.total))
        kind = self.kinds.get(self.node) if self.node else None
        message = None
        if kind and self.steps:
            message = f"{kind} {self.step}/{self.steps}"
        return {
            "value": value,
            "nodes_done": done,
            "nodes_total": self.total,
            "current_node": self.node,
            "current_node_class": kind if isinstance(kind, str) else None,
            "step": self.step,
            "steps": self.steps,
            "message": message,
        }


class _Gone(ComfyfleetError):
    """The stream has said its last word: it ends here."""


class _Stream:
    """One client's stream: what it has been sent, so nothing goes twice."""

    def __init__(self, request: web.Request, response: web.StreamResponse, job: Job) -> None:
        self.request = request
        self.response = response
        self.job = job
        self.progress = _Progress(job)
        self.sent_outputs: set[str] = set()
        self.status = shapes.V2_STATUS[job.status]
        self.last_progress = 0.0
        self.last_preview = 0.0
        self.last_write = time.monotonic()

    async def send(self, event: str, data: dict[str, Any]) -> None:
        await self.response.write(sse(event, data))
        self.last_write = time.monotonic()

    async def outputs(self, ui: dict[str, Any], job: Job) -> None:
        gw = self.request.app[GATEWAY]
        found = await shapes.outputs_body(
            folders_of(self.request), base_url(self.request), job, ui, gw.config.history_max_age
        )
        for output in found:
            if output["id"] not in self.sent_outputs:
                self.sent_outputs.add(output["id"])
                await self.send("output", output)

    async def logged(self, event: PromptEvent) -> None:
        binary = log_frames.from_log(event)
        if isinstance(binary, PreviewImage):
            now = time.monotonic()
            if now - self.last_preview >= PREVIEW_EVERY:
                self.last_preview = now
                await self.send(
                    "preview",
                    {
                        "node_id": binary.node_id,
                        "content_type": binary.mime_type,
                        "data_base64": base64.b64encode(binary.data).decode(),
                    },
                )
            return
        if binary is not None or event.frame is not None:
            return
        if event.type == "execution_start" and self.status == "queued":
            self.status = "running"
            await self.send("status", {"status": "running", "queue_position": None})
        if event.type == "executed" and isinstance(event.data.get("output"), dict):
            node = str(event.data.get("node"))
            await self.outputs({node: event.data["output"]}, self.job)
        if self.progress.apply(event.type, event.data):
            now = time.monotonic()
            if now - self.last_progress >= PROGRESS_EVERY or event.type == "executed":
                self.last_progress = now
                await self.send("progress", self.progress.snapshot())

    async def checked(self) -> Job | None:
        """The job's record now; sends its status when it moved. The job once over."""
        gw = self.request.app[GATEWAY]
        job = await gw.store.get(self.job.prompt_id)
        if job is None:  # deleted meanwhile (retention): it is gone for good
            await self.send("status", {"status": "expired", "queue_position": None})
            raise _Gone
        if job.status in TERMINAL:
            return job
        status = shapes.V2_STATUS[job.status]
        if status == "running" and gw.scheduler.cancelling(job.prompt_id):
            status = "canceling"
        if status != self.status:
            self.status = status
            await self.send("status", {"status": status, "queue_position": None})
        return None

    async def finish(self, job: Job) -> None:
        """The outputs not sent yet, then the terminal status."""
        entry = await self.request.app[GATEWAY].store.history_entry(job.prompt_id)
        if entry is not None:
            await self.outputs(entry.result.outputs, job)
        await self.send("status", status_event(job))


async def _next(stream: AsyncGenerator[PromptEvent, None]) -> PromptEvent | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


async def job_events(request: web.Request, streams: set[web.StreamResponse]) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    job = await own_job(request)
    if len(streams) >= MAX_STREAMS:
        raise V2Error(
            429,
            "too_many_streams",
            "Too many event streams are open; poll GET /api/v2/jobs/{id} instead",
            headers={"Retry-After": "5"},
        )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    streams.add(response)
    stream = _Stream(request, response, job)
    log = gw.events.follow(job.prompt_id) if gw.events is not None else None
    pending: asyncio.Future[PromptEvent | None] | None = None
    try:
        if job.status in TERMINAL:
            await stream.finish(job)
            return response
        await stream.send("status", status_event(job))
        log_open = log is not None
        next_check = time.monotonic() + CHECK_EVERY
        while True:
            if log_open and pending is None:
                assert log is not None
                pending = asyncio.ensure_future(_next(log))
            wait = max(0.0, next_check - time.monotonic())
            if pending is not None:
                done, _ = await asyncio.wait({pending}, timeout=wait)
            else:
                await asyncio.sleep(wait)
                done = set()
            if pending is not None and pending in done:
                event, pending = pending.result(), None
                if event is None:
                    log_open = False  # the done signal: the record says how it ended
                    next_check = time.monotonic()
                else:
                    await stream.logged(event)
                    continue
            if time.monotonic() >= next_check:
                if not gw.serving:  # shutting down: the client polls, or reconnects elsewhere
                    return response
                next_check = time.monotonic() + CHECK_EVERY
                over = await stream.checked()
                if over is not None:
                    await stream.finish(over)
                    return response
                if time.monotonic() - stream.last_write >= KEEP_ALIVE:
                    await response.write(b": keep-alive\n\n")
                    stream.last_write = time.monotonic()
    except _Gone:
        return response
    finally:
        streams.discard(response)
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        if log is not None:
            await log.aclose()


def v2_event_routes() -> list[Route]:
    streams: set[web.StreamResponse] = set()  # this app's open streams

    async def events(request: web.Request) -> web.StreamResponse:
        return await job_events(request, streams)

    return [Route("GET", f"{PREFIX}/jobs/{{job_id}}/events", events)]
