"""Following any prompt by id: subscriptions on the WebSocket, and Server-Sent Events.

Both read the event log (event_log.py): committed events, from the first (or after the
last id received), then each as it commits, ending after the done signal. Binary frames
(previews, progress text; log_frames.py says which the log keeps) come too: on the
WebSocket as the socket takes them from the gateway running the prompt (a preview as
code 4 when it announced `supports_preview_metadata`, else as code 1 after its
`progress` frame), over SSE as `binary` events (see `sse_event`). Only the
caller's tenant's prompts can be followed (any of them, with or without a client_id:
knowing the id is what it takes), and an unknown prompt and another tenant's get the
same answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from typing import Any

from aiohttp import web

from comfyfleet.domain.prompt_events import PromptEvent
from comfyfleet.engine.events import PreviewImage, ProgressText
from comfyfleet.protocol import frames
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.access.auth import visible
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.delivery.event_log import EventLog
from comfyfleet.server.delivery.hub import MAX_BACKLOG, ClientSocket
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.plumbing.routing import Route

#: Prompts one WebSocket may follow at once.
MAX_SUBSCRIPTIONS = 64
#: The longest prompt_id (as POST /prompt takes them).
MAX_PROMPT_ID = 200
#: Seconds between SSE comments that keep a quiet stream's connection open.
KEEP_ALIVE = 15.0
#: The largest event id a client may name (a bigint).
MAX_EVENT_ID = 2**63 - 1
#: What an SSE `event:` field may hold; another type is sent as `message`.
_EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

NO_SUCH_PROMPT = "no such prompt"


# -- WebSocket ------------------------------------------------------------------------


class Subscriptions:
    """The prompts one socket follows: `{"type": "subscribe", "data": {"prompt_id": ID}}`
    and `unsubscribe`. Each is acknowledged (`subscribed` / `unsubscribed`) or refused
    (`subscribe_error` with a message); a subscription replays the prompt's frames so far,
    then sends each as it happens, and ends after its done signal."""

    def __init__(self, sock: ClientSocket, gateway: Gateway, tenant: str | None) -> None:
        self.sock = sock
        self.gateway = gateway
        self.tenant = tenant  # None: every prompt is visible (authentication off)
        self._relays: dict[str, asyncio.Task[None]] = {}
        self._plain_previews: dict[str, PreviewImage] = {}  # code 1, due after `progress`

    @staticmethod
    def wanted(message: Any) -> bool:
        return isinstance(message, dict) and message.get("type") in ("subscribe", "unsubscribe")

    async def handle(self, message: dict[str, Any]) -> None:
        data = message.get("data")
        prompt_id = data.get("prompt_id") if isinstance(data, dict) else None
        if not isinstance(prompt_id, str) or not 0 < len(prompt_id) <= MAX_PROMPT_ID:
            self._refuse(
                None, f"data.prompt_id must be a string of 1 to {MAX_PROMPT_ID} characters"
            )
        elif message["type"] == "unsubscribe":
            await self._stop(prompt_id)
            self.sock.send_json("unsubscribed", {"prompt_id": prompt_id})
        else:
            await self._subscribe(prompt_id)

    async def _subscribe(self, prompt_id: str) -> None:
        log = self.gateway.events
        if log is None:
            self._refuse(prompt_id, "the event log is off (events_retention = 0)")
            return
        if prompt_id in self._relays:  # already followed: nothing to replay twice
            self.sock.send_json("subscribed", {"prompt_id": prompt_id})
            return
        if len(self._relays) >= MAX_SUBSCRIPTIONS:
            self._refuse(prompt_id, f"at most {MAX_SUBSCRIPTIONS} subscriptions per socket")
            return
        job = await self.gateway.store.get(prompt_id)
        if job is None or (self.tenant is not None and job.tenant != self.tenant):
            self._refuse(prompt_id, NO_SUCH_PROMPT)
            return
        # From now on its frames come from the log, not the router (no frame twice).
        self.sock.following.add(prompt_id)
        self.sock.send_json("subscribed", {"prompt_id": prompt_id})
        self._relays[prompt_id] = asyncio.create_task(
            self._relay(log, prompt_id), name=f"ws-follow-{prompt_id[:40]}"
        )

    async def _relay(self, log: EventLog, prompt_id: str) -> None:
        try:
            async for event in log.follow(prompt_id):
                self._send(prompt_id, event)
                # A long replay waits for the socket to write, rather than overflow it.
                while self.sock.backlog > MAX_BACKLOG // 2:
                    await asyncio.sleep(0.05)
        finally:
            if self._relays.get(prompt_id) is asyncio.current_task():
                del self._relays[prompt_id]
                self.sock.following.discard(prompt_id)
                self._plain_previews.pop(prompt_id, None)

    def _send(self, prompt_id: str, event: PromptEvent) -> None:
        """One logged frame, in the order ClientRouter gives a socket like this one."""
        binary = log_frames.from_log(event)
        if isinstance(binary, ProgressText):
            self.sock.send(frames.text(binary.node_id, binary.text))
        elif isinstance(binary, PreviewImage):
            if self.sock.supports_preview_metadata:
                self.sock.send(frames.preview_with_metadata(binary.metadata(), binary.data))
            else:
                self._send_plain_preview(prompt_id)
                self._plain_previews[prompt_id] = binary
        elif event.frame is None:
            if event.done:
                self._send_plain_preview(prompt_id)
            self.sock.send_json(event.type, event.data)
            if event.type == "progress":
                self._send_plain_preview(prompt_id)

    def _send_plain_preview(self, prompt_id: str) -> None:
        preview = self._plain_previews.pop(prompt_id, None)
        if preview is not None:
            self.sock.send(frames.preview_image(preview.format, preview.data))

    async def _stop(self, prompt_id: str) -> None:
        relay = self._relays.pop(prompt_id, None)
        if relay is not None:
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)
        self.sock.following.discard(prompt_id)

    def _refuse(self, prompt_id: str | None, message: str) -> None:
        self.sock.send_json("subscribe_error", {"prompt_id": prompt_id, "message": message})

    async def close(self) -> None:
        for prompt_id in list(self._relays):
            await self._stop(prompt_id)


# -- Server-Sent Events ------------------------------------------------------------------


def _error(status: type[web.HTTPException], kind: str, message: str) -> web.HTTPException:
    body = prompt_error_body(error(kind, message))
    return status(text=json.dumps(body), content_type="application/json")


def _resume_after(request: web.Request) -> int:
    """The id after which to resume: the `Last-Event-ID` header (what a browser's
    EventSource sends when it reconnects), else `?last_event_id=`, else 0."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0"
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_EVENT_ID:
        raise _error(
            web.HTTPBadRequest,
            "invalid_last_event_id",
            "Last-Event-ID (or last_event_id) must be an event id: a whole number >= 0",
        )
    return int(raw)


def sse_event(event: PromptEvent) -> bytes | None:
    """One event as SSE: its id, its type as the event name, its data as one JSON line.

    A binary frame is a `binary` event: `{"event": CODE, "frame": BASE64}`, the frame as
    ComfyUI sends it on a WebSocket, base64-encoded (a preview with its metadata, code
    4; progress text, code 3). None for a binary kind this version does not know."""
    binary = log_frames.from_log(event)
    if binary is not None:
        if isinstance(binary, PreviewImage):
            code = frames.PREVIEW_IMAGE_WITH_METADATA
            frame = frames.preview_with_metadata(binary.metadata(), binary.data)
        else:
            code, frame = frames.TEXT, frames.text(binary.node_id, binary.text)
        payload = {"event": code, "frame": base64.b64encode(frame).decode()}
        return f"id: {event.id}\nevent: binary\ndata: {json.dumps(payload)}\n\n".encode()
    if event.frame is not None:
        return None
    name = event.type if _EVENT_NAME.fullmatch(event.type) else "message"
    data = json.dumps(event.data, separators=(",", ":"))  # no raw newline in JSON text
    return f"id: {event.id}\nevent: {name}\ndata: {data}\n\n".encode()


async def job_events(request: web.Request) -> web.StreamResponse:
    """`GET /api/jobs/{job_id}/events`: the prompt's events as Server-Sent Events."""
    gw = request.app[GATEWAY]
    after = _resume_after(request)
    prompt_id = request.match_info["job_id"]
    job = await gw.store.get(prompt_id)
    if job is None or not visible(request, job.tenant):  # another tenant's: as if unknown
        raise _error(web.HTTPNotFound, "not_found", "No such job")
    log = gw.events
    if log is None:
        raise _error(web.HTTPNotFound, "not_found", "The event log is off (events_retention = 0)")
    if after and await log.ended_before(prompt_id, after):
        return web.Response(status=204)  # tells an EventSource to stop reconnecting
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # no proxy buffering
        }
    )
    await response.prepare(request)
    stream = log.follow(prompt_id, after)
    pending: asyncio.Future[PromptEvent] | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(stream))
            while not (await asyncio.wait({pending}, timeout=KEEP_ALIVE))[0]:
                await response.write(b": keep-alive\n\n")
            try:
                event = pending.result()
            except StopAsyncIteration:
                break
            if (sent := sse_event(event)) is not None:
                await response.write(sent)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await stream.aclose()
    return response


def follow_routes() -> list[Route]:
    return [Route("GET", "/api/jobs/{job_id}/events", job_events)]
