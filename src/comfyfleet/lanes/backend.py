"""A connection to one ComfyUI backend: HTTP calls and one WebSocket, demultiplexed.

The gateway submits every prompt with this connection's own clientId, so the
backend sends all of a prompt's frames here; they are handed to whoever
watches that prompt_id. Frames that carry no prompt_id (type-1 previews,
text) belong to the prompt the backend is executing, which a ComfyUI
process does one at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from comfyfleet.engine.events import EngineEvent, Message, PreviewImage, ProgressText
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol import frames
from comfyfleet.protocol.events import END_EVENTS
from comfyfleet.protocol.prompt import queue_item_ids

log = logging.getLogger(__name__)

#: Answers bigger than this are parsed in a worker thread.
LARGE_JSON = 256 * 1024
#: Most a backend may send: a JSON answer (object_info of a large install is tens of
#: MB), a file (an output or a preview) and one WebSocket message. Past these the
#: backend is out of protocol: its answer is refused rather than held in memory.
MAX_JSON_BYTES = 256 * 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024 * 1024
MAX_WS_MESSAGE = 64 * 1024 * 1024
MIME_FORMAT = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}


class BackendError(ComfyfleetError):
    """The backend could not be reached or answered out of protocol."""


class BackendAnswered(BackendError):
    """The backend answered, but not with what was asked: an error status, or a body out
    of protocol (it is there: this says nothing of whether it is up)."""


class BackendLost(BackendError):
    """The connection dropped while a prompt was running there."""


class Withdrawn(BackendError):
    """The prompt was taken out of the backend's queue before it started there."""


@dataclass(frozen=True)
class FileAnswer:
    """A backend's answer to a GET, as data: the server decides how to pass it on."""

    status: int
    body: bytes
    content_type: str


@dataclass(frozen=True)
class BackendSpec:
    url: str
    name: str
    slots: int = 1
    prefetch: int = 0
    tags: tuple[str, ...] = ()
    auth_header: str | None = None  # "Name: value", sent on every request

    def headers(self) -> dict[str, str]:
        """The auth header to send; a value `env:NAME` is read from that variable."""
        if not self.auth_header:
            return {}
        name, _, value = self.auth_header.partition(":")
        value = value.strip()
        if value.startswith("env:"):
            value = os.environ.get(value[4:], "")
        return {name.strip(): value}

    @property
    def auth_is_reference(self) -> bool:
        """Whether the auth header names a variable rather than holding the secret."""
        value = (self.auth_header or "").partition(":")[2].strip()
        return value.startswith("env:")


@dataclass
class WorkerLink:
    """What a lane reached through a worker's connection knows of it (for the dashboard
    and the admin API): where it connected from, since when, its last word, its state."""

    address: str
    connected_at: float  # time.time()
    seen_at: float
    state: str = "connected"  # connected, draining, away
    # Its devices and memory, as its backend reports them (server/workers/machine.py).
    machine: dict[str, Any] | None = None


@dataclass
class PromptWatch:
    """The frames of one prompt as they arrive, and when the last one came.

    While ticking, a None joins the queue every so often, so its reader can look at
    the clock without arming a timeout for every frame. `on_end` is called as the
    prompt's end event arrives, before its reader gets to it (the reader may be busy
    copying the outputs that came just before)."""

    prompt_id: str
    on_end: Callable[[], None] | None = None
    queue: asyncio.Queue[EngineEvent | BackendError | None] = field(default_factory=asyncio.Queue)
    last_frame: float = field(default_factory=time.monotonic)
    started: bool = False
    # When the backend last said it holds the prompt for this gateway (a comfyfleet
    # backend: see scheduler/holds.py): its submit's answer, then each keep's.
    kept_at: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # this gateway gave up on it there: no longer kept
    lost: bool = False  # the connection dropped since: is it still there once back?
    _ticker: asyncio.TimerHandle | None = field(default=None, repr=False)

    def start_ticks(self, every: float) -> None:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.queue.put_nowait(None)
            self._ticker = loop.call_later(every, tick)

        self._ticker = loop.call_later(every, tick)

    def stop_ticks(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()


class BackendClient:
    def __init__(
        self, spec: BackendSpec, session: aiohttp.ClientSession, client_id: str | None = None
    ) -> None:
        self.spec = spec
        self.session = session
        # Pass one that is stable across gateway restarts: the backend sends a prompt's
        # frames to the clientId it was submitted with, so a re-attached prompt's frames
        # only reach the new socket when it connects under the same id.
        self.client_id = client_id or f"comfyfleet-{uuid.uuid4().hex}"
        self.connected = asyncio.Event()
        self.disconnected = asyncio.Event()  # set from a drop until the next connect
        self._watches: dict[str, PromptWatch] = {}
        self._current: tuple[str, str] | None = None  # (prompt_id, node) executing now
        self._reader: asyncio.Task[None] | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    @property
    def base(self) -> str:
        return self.spec.url.rstrip("/")

    # -- HTTP ----------------------------------------------------------------

    async def request(self, method: str, path: str, *, timeout: float = 30.0, **kwargs: Any) -> Any:
        """JSON of a 2xx answer (None when empty); BackendError otherwise."""
        body = await self._body(method, path, timeout, **kwargs)
        try:
            if len(body) > LARGE_JSON:  # e.g. object_info: parse it off the event loop
                return await asyncio.to_thread(json.loads, body)
            return json.loads(body) if body.strip() else None
        except (ValueError, RecursionError) as exc:
            raise BackendAnswered(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def json_bytes(self, path: str, *, timeout: float = 30.0) -> bytes:
        """The body of a 2xx answer to GET `path`, unparsed (the caller may know it
        already: a fleet of backends with the same nodes sends the same object_info)."""
        return await self._body("GET", path, timeout)

    async def _body(self, method: str, path: str, timeout: float, **kwargs: Any) -> bytes:
        """The body of a 2xx answer, at most MAX_JSON_BYTES; BackendError otherwise."""
        try:
            async with self.session.request(
                method,
                self.base + path,
                headers=self.spec.headers(),
                timeout=aiohttp.ClientTimeout(total=timeout),
                **kwargs,
            ) as response:
                body = await _read_capped(response, MAX_JSON_BYTES, f"{method} {path}")
                if response.status >= 400:
                    raise BackendAnswered(
                        f"{method} {path}: HTTP {response.status}: {body[:300]!r}"
                    )
                return body
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def read_bytes(self, path: str, params: dict[str, str], timeout: float = 60.0) -> bytes:
        try:
            async with self.session.get(
                self.base + path,
                params=params,
                headers=self.spec.headers(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                if response.status != 200:
                    raise BackendError(f"GET {path}: HTTP {response.status}")
                return await _read_capped(response, MAX_FILE_BYTES, f"GET {path}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"GET {path}: {type(exc).__name__}: {exc}") from exc

    async def read_file(
        self,
        path: str,
        params: dict[str, str] | None = None,
        *,
        max_bytes: int = MAX_FILE_BYTES,
        timeout: float = 120.0,
    ) -> FileAnswer:
        """A GET's answer, for passing it on (a redirect is passed on as such, never
        followed); BackendError when it fails or is longer than `max_bytes`."""
        try:
            async with self.session.get(
                self.base + path,
                params=params,
                headers=self.spec.headers(),
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as response:
                body = await _read_capped(response, max_bytes, f"GET {path}")
                return FileAnswer(response.status, body, response.content_type)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"GET {path}: {type(exc).__name__}: {exc}") from exc

    async def submit(self, body: dict[str, Any]) -> tuple[int, Any]:
        """POST /prompt as this connection's client; (status, JSON body) — 400s included."""
        return await self.post_json("/prompt", {**body, "client_id": self.client_id})

    async def post_json(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """(status, JSON body) of a POST, error statuses included."""
        try:
            async with self.session.post(
                self.base + path,
                json=body,
                headers=self.spec.headers(),
                timeout=aiohttp.ClientTimeout(total=30.0),
            ) as response:
                raw = await _read_capped(response, MAX_JSON_BYTES, f"POST {path}")
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        try:
            return status, json.loads(raw) if raw.strip() else None
        except (ValueError, RecursionError) as exc:
            raise BackendAnswered(f"POST {path}: {type(exc).__name__}: {exc}") from exc

    async def model_files(self) -> dict[str, list[str]]:
        """The files of each model folder the backend lists (`GET /models/{folder}`)."""
        models: dict[str, list[str]] = {}
        folders = await self.request("GET", "/models", timeout=30.0)
        for folder in folders if isinstance(folders, list) else []:
            try:
                files = await self.request("GET", f"/models/{folder}", timeout=30.0)
            except BackendError:
                continue  # a folder it lists but cannot read: no files known there
            if isinstance(files, list):
                models[str(folder)] = [str(f) for f in files]
        return models

    async def history(self, prompt_id: str) -> dict[str, Any] | None:
        found = await self.request("GET", f"/history/{prompt_id}")
        return found.get(prompt_id) if isinstance(found, dict) else None

    async def queue_ids(self, *, mine: bool = False) -> tuple[set[str], set[str]]:
        """(running, pending) prompt ids on the backend; with `mine`, only those this
        connection's client id submitted (others may share the backend)."""
        queue = await self.request("GET", "/queue")
        if not isinstance(queue, dict):
            raise BackendError("/queue is not a JSON object")
        client_id = self.client_id if mine else None
        return (
            set(queue_item_ids(queue.get("queue_running"), client_id)),
            set(queue_item_ids(queue.get("queue_pending"), client_id)),
        )

    async def interrupt(self, prompt_id: str) -> None:
        await self.request("POST", "/interrupt", json={"prompt_id": prompt_id})

    async def delete_pending(self, prompt_id: str) -> None:
        await self.request("POST", "/queue", json={"delete": [prompt_id]})

    # -- WebSocket -------------------------------------------------------------

    async def connect(self) -> None:
        """Open the WebSocket (announcing preview metadata, so previews carry prompt ids)."""
        if self.connected.is_set():
            return
        try:
            ws = await self.session.ws_connect(
                f"{self.base}/ws?clientId={self.client_id}",
                headers=self.spec.headers(),
                heartbeat=20.0,
                max_msg_size=MAX_WS_MESSAGE,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"websocket: {type(exc).__name__}: {exc}") from exc
        await ws.send_str(
            json.dumps({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        )
        self._ws = ws
        self.connected.set()
        self.disconnected.clear()
        self._reader = asyncio.create_task(self._read(ws), name=f"backend-{self.spec.name}-ws")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        self._lost("closed")

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self._on_text(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    self._on_binary(message.data)
                elif message.type == aiohttp.WSMsgType.ERROR:
                    break
        finally:
            self._lost("websocket closed")

    def _lost(self, why: str) -> None:
        if self.connected.is_set():
            log.warning("backend %s lost: %s", self.spec.name, why)
        self.connected.clear()
        self.disconnected.set()
        self._ws = None
        self._current = None
        for watch in self._watches.values():
            watch.queue.put_nowait(BackendLost(f"backend {self.spec.name}: {why}"))

    # -- demultiplexing ----------------------------------------------------------

    def watch(self, prompt_id: str, on_end: Callable[[], None] | None = None) -> PromptWatch:
        watch = self._watches[prompt_id] = PromptWatch(prompt_id, on_end)
        return watch

    def watched(self) -> dict[str, PromptWatch]:
        """The prompts followed there now, by id."""
        return dict(self._watches)

    def unwatch(self, prompt_id: str) -> None:
        watch = self._watches.pop(prompt_id, None)
        if watch is not None:
            watch.stop_ticks()

    def _deliver(self, prompt_id: str | None, event: EngineEvent) -> None:
        watch = self._watches.get(prompt_id) if prompt_id else None
        if watch is not None:
            watch.last_frame = time.monotonic()
            watch.queue.put_nowait(event)
            if watch.on_end is not None and isinstance(event, Message) and event.type in END_EVENTS:
                watch.on_end()

    def _on_text(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            return  # not a frame of the protocol: nothing to relay
        if not (isinstance(frame, dict) and isinstance(frame.get("type"), str)):
            return
        kind, data = frame["type"], frame.get("data")
        if not isinstance(data, dict) or kind in ("status", "feature_flags"):
            return
        prompt_id = data.get("prompt_id")
        if kind == "executing":
            node = data.get("node")
            self._current = (str(prompt_id), str(node)) if node is not None else None
        if kind == "execution_start" and prompt_id in self._watches:
            self._watches[prompt_id].started = True
        self._deliver(prompt_id, Message(kind, data))

    def _on_binary(self, payload: bytes) -> None:
        try:
            frame = frames.decode(payload)
        except (ValueError, json.JSONDecodeError):
            return
        current_prompt, current_node = self._current or (None, "")
        if frame.event_code == frames.PREVIEW_IMAGE_WITH_METADATA:
            meta = frame.header["metadata"]
            fmt = MIME_FORMAT.get(meta.get("image_type", ""), "PNG")
            prompt_id = meta.get("prompt_id") or current_prompt
            event: EngineEvent = PreviewImage(
                prompt_id or "", meta.get("node_id", current_node), fmt, frame.payload
            )
            self._deliver(prompt_id, event)
        elif frame.event_code == frames.PREVIEW_IMAGE:
            fmt = "PNG" if frame.header.get("image_type") == 2 else "JPEG"
            self._deliver(
                current_prompt, PreviewImage(current_prompt or "", current_node, fmt, frame.payload)
            )
        elif frame.event_code == frames.TEXT:
            node_id = frame.header["node_id"]
            text = frame.payload.decode("utf-8", "replace")
            self._deliver(current_prompt, ProgressText(current_prompt or "", node_id, text))


async def _read_capped(response: aiohttp.ClientResponse, cap: int, what: str) -> bytes:
    """The body of a backend's answer, refused (BackendError) past `cap` bytes: as soon as
    its Content-Length says so, else once that many have come."""
    if response.content_length is not None and response.content_length > cap:
        raise BackendError(f"{what}: {response.content_length} bytes, past the {cap} allowed")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 20):
        size += len(chunk)
        if size > cap:
            raise BackendError(f"{what}: more than the {cap} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)
