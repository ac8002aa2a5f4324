"""`GET /api/v2/jobs/{id}/events`: a job's live events as v2's Server-Sent Events.

v2's stream is live, with no replay cursor (no `id:` lines; a client that reconnects
gets a fresh snapshot): first a `status` event (the job's state now, and a queued job's
`queue_position`: see live.py; another `status` each time it moves up), then `progress`
(a whole snapshot each: nodes done of the graph's, the running node's steps),
`preview` (a node's preview image, base64) and `output` (each file a node saves, as
the job's Output objects name it), and last the terminal `status`, after which the
stream ends. Every output comes before the terminal status: the SDK stops reading there.

Built on the event log (delivery/event_log.py), so a job running on another gateway of
the store streams too. The store's job record is the authority on the state: it is read
once a second besides (with a queued job's place), so a job cancelled while queued
(which logs no events) or a log that is off (`events_retention = 0`) still ends its
stream promptly. Previews and progress are sent at most a few times a second.
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
from comfyfleet.server.comfy_api_v2 import live, shapes
from comfyfleet.server.comfy_api_v2.errors import PREFIX, V2Error
from comfyfleet.server.comfy_api_v2.jobs import base_url, folders_of, own_job
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.jobs_api.cancels import cancelling
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


async def status_event(request: web.Request, job: Job) -> dict[str, Any]:
    """A `status` event: the job's state and, while it waits, its place in the queue."""
    position = await live.queue_position(request.app[GATEWAY], job)
    return {"status": shapes.V2_STATUS[job.status], "queue_position": position}


class _Gone(ComfyfleetError):
    """The stream has said its last word: it ends here."""


class _Stream:
    """One client's stream: what it has been sent, so nothing goes twice."""

    def __init__(self, request: web.Request, response: web.StreamResponse, job: Job) -> None:
        self.request = request
        self.response = response
        self.job = job
        self.progress = live.Progress(job)
        self.sent_outputs: set[str] = set()
        self.status = shapes.V2_STATUS[job.status]
        self.position: int | None = None  # the queue_position last sent
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
            await self.send_status("running", None)
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
        if status == "running" and cancelling(gw, job.prompt_id):
            status = "canceling"
        position = await live.queue_position(gw, job)
        if (status, position) != (self.status, self.position):  # moved up the queue too
            await self.send_status(status, position)
        return None

    async def send_status(self, status: str, position: int | None) -> None:
        self.status, self.position = status, position
        await self.send("status", {"status": status, "queue_position": position})

    async def finish(self, job: Job) -> None:
        """The outputs not sent yet, then the terminal status."""
        entry = await self.request.app[GATEWAY].store.history_entry(job.prompt_id)
        if entry is not None:
            await self.outputs(entry.result.outputs, job)
        await self.send("status", await status_event(self.request, job))


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
        first = await status_event(request, job)
        await stream.send_status(first["status"], first["queue_position"])
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
