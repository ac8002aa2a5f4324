"""Real clients of a real gateway: HTTP through aiohttp, WebSocket frames kept as they arrive.

`serve()` starts an in-process server on 127.0.0.1 (tests/servers.py) with a client
session; `Socket` reads one `/ws?clientId=` connection in the background so a test can
wait for a frame (by predicate, with a timeout) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from comfyfleet.protocol import frames
from comfyfleet.server.gateway import Gateway
from tests.servers import start_in_process

TIMEOUT = 30.0


@dataclass(frozen=True)
class Received:
    """One WebSocket frame: a JSON event (`type`, `data`) or a decoded binary frame."""

    type: str  # the JSON "type", or "binary"
    data: Any  # the JSON "data", or a comfyfleet.protocol.frames.Frame

    @property
    def prompt_id(self) -> str | None:
        if self.type == "binary":
            meta = self.data.header.get("metadata")
            return meta.get("prompt_id") if isinstance(meta, dict) else None
        return self.data.get("prompt_id") if isinstance(self.data, dict) else None

    def is_done(self, prompt_id: str) -> bool:
        """`executing {node: null}` of `prompt_id`: ComfyUI's done signal."""
        return (
            self.type == "executing"
            and self.data.get("node") is None
            and self.data.get("prompt_id") == prompt_id
        )

    def describe(self) -> str:
        if self.type == "binary":
            return f"binary:{self.data.event_code}"
        if self.type == "executing":
            return f"executing:{self.data.get('node')}"
        if self.type == "status":
            return f"status:{self.data['status']['exec_info']['queue_remaining']}"
        return self.type


class Socket:
    """One client connection; a background task appends every frame to `frames`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, client_id: str) -> None:
        self.ws = ws
        self.client_id = client_id
        self.frames: list[Received] = []
        self.closed = False
        self._arrived = asyncio.Condition()
        self._reader = asyncio.create_task(self._read(), name=f"test-ws-{client_id}")

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(message.data)
                    frame = Received(event["type"], event["data"])
                elif message.type == aiohttp.WSMsgType.BINARY:
                    frame = Received("binary", frames.decode(message.data))
                else:
                    continue
                async with self._arrived:
                    self.frames.append(frame)
                    self._arrived.notify_all()
        finally:
            self.closed = True
            async with self._arrived:
                self._arrived.notify_all()

    async def wait_for(
        self,
        predicate: Callable[[Received], bool],
        *,
        after: int = 0,
        timeout: float = TIMEOUT,
        what: str = "a matching frame",
    ) -> int:
        """The index of the first frame at or after `after` that matches."""
        scanned = after
        try:
            async with asyncio.timeout(timeout), self._arrived:
                while True:
                    for index in range(scanned, len(self.frames)):
                        if predicate(self.frames[index]):
                            return index
                    scanned = max(scanned, len(self.frames))
                    if self.closed:
                        raise AssertionError(f"{self.client_id}: socket closed before {what}")
                    await self._arrived.wait()
        except TimeoutError:
            seen = [f.describe() for f in self.frames[after:]][-40:]
            raise AssertionError(
                f"{self.client_id}: no {what} in {timeout} s; got {seen}"
            ) from None

    async def wait_until(
        self, condition: Callable[[list[Received]], bool], *, timeout: float = TIMEOUT, what: str
    ) -> None:
        """Wait until `condition(frames)` holds for everything received so far."""
        try:
            async with asyncio.timeout(timeout), self._arrived:
                while not condition(self.frames):
                    if self.closed:
                        raise AssertionError(f"{self.client_id}: socket closed before {what}")
                    await self._arrived.wait()
        except TimeoutError:
            seen = [f.describe() for f in self.frames][-40:]
            raise AssertionError(
                f"{self.client_id}: not {what} in {timeout} s; got {seen}"
            ) from None

    async def done(self, prompt_id: str, *, after: int = 0, timeout: float = TIMEOUT) -> int:
        return await self.wait_for(
            lambda f: f.is_done(prompt_id),
            after=after,
            timeout=timeout,
            what=f"executing null for {prompt_id}",
        )

    async def progress(self, prompt_id: str, node: str, *, after: int = 0) -> int:
        """The next `progress` frame of one node: the node is running (and still reporting)."""
        return await self.wait_for(
            lambda f: (
                f.type == "progress" and f.data["prompt_id"] == prompt_id and f.data["node"] == node
            ),
            after=after,
            what=f"progress of node {node} of {prompt_id}",
        )

    def of_prompt(self, prompt_id: str) -> list[Received]:
        return [f for f in self.frames if f.prompt_id == prompt_id]

    def json_types(self, prompt_id: str | None = None) -> list[str]:
        return [
            f.type
            for f in self.frames
            if f.type != "binary" and (prompt_id is None or f.prompt_id == prompt_id)
        ]

    async def send_json(self, message: Any) -> None:
        await self.ws.send_json(message)

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


@dataclass
class Reply:
    status: int
    content_type: str | None
    headers: dict[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Served:
    """A running gateway and a client session to it."""

    server: TestServer
    gateway: Gateway
    session: aiohttp.ClientSession
    data_dir: Path
    sockets: list[Socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def connect(
        self, client_id: str | None = None, *, preview_metadata: bool = False
    ) -> Socket:
        """Connect and wait for the greeting `status` (and the feature_flags reply if asked)."""
        client_id = client_id or uuid.uuid4().hex
        ws = await self.session.ws_connect(f"{self.url}/ws?clientId={client_id}")
        sock = Socket(ws, client_id)
        self.sockets.append(sock)
        await sock.wait_for(lambda f: f.type == "status", what="the greeting status")
        if preview_metadata:
            await sock.send_json(
                {"type": "feature_flags", "data": {"supports_preview_metadata": True}}
            )
            await sock.wait_for(lambda f: f.type == "feature_flags", what="feature_flags reply")
        return sock

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if data is not None:
            kwargs["data"] = data
        elif body is not None:
            kwargs["json"] = body
        async with self.session.request(method, self.url + path, **kwargs) as response:
            text = await response.text()
            return Reply(
                response.status, response.headers.get("Content-Type"), dict(response.headers), text
            )

    async def get(self, path: str) -> Any:
        reply = await self.request("GET", path)
        assert reply.status == 200, (path, reply.status, reply.text)
        return reply.json

    async def post(self, path: str, body: Any) -> Reply:
        return await self.request("POST", path, body)

    async def submit(
        self, prompt: dict[str, Any], client_id: str | None = None, **extra: Any
    ) -> str:
        """POST /prompt; asserts it was accepted; returns the prompt_id."""
        body: dict[str, Any] = {"prompt": prompt, **extra}
        if client_id is not None:
            body["client_id"] = client_id
        reply = await self.post("/prompt", body)
        assert reply.status == 200, reply.text
        prompt_id: str = reply.json["prompt_id"]
        return prompt_id

    async def run_in_turn(self, sock: Socket, prompts: Iterable[dict[str, Any]]) -> list[str]:
        """Submit each prompt for `sock`'s client once the one before is done; their ids."""
        ids = []
        for prompt in prompts:
            prompt_id = await self.submit(prompt, sock.client_id)
            await sock.done(prompt_id)
            ids.append(prompt_id)
        return ids

    async def history_entry(self, prompt_id: str) -> dict[str, Any]:
        body = await self.get(f"/history/{prompt_id}")
        entry: dict[str, Any] = body.get(prompt_id, {})
        return entry

    async def job(self, prompt_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self.get(f"/api/jobs/{prompt_id}")
        return job

    async def wait_history(self, prompt_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Poll /history/{id} until the entry exists (the only signal without a client_id)."""
        found: dict[str, Any] = {}

        async def present() -> bool:
            found.update(await self.history_entry(prompt_id))
            return bool(found)

        await poll(present, timeout=timeout, what=f"a history entry for {prompt_id}")
        return found

    async def wait_job(self, prompt_id: str, *statuses: str, timeout: float = TIMEOUT) -> None:
        async def reached() -> bool:
            return (await self.job(prompt_id))["status"] in statuses

        await poll(reached, timeout=timeout, what=f"job {prompt_id} in {statuses}")

    async def wait_idle(self, timeout: float = TIMEOUT) -> None:
        """Until nothing is pending or running (GET /prompt)."""

        async def idle() -> bool:
            info = await self.get("/prompt")
            return bool(info["exec_info"]["queue_remaining"] == 0)

        await poll(idle, timeout=timeout, what="an idle queue")


async def poll(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float = TIMEOUT,
    what: str,
    every: float = 0.02,
) -> None:
    """Re-check a server-side condition until it holds (for state no frame announces)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


@asynccontextmanager
async def serve(data_dir: Path, **settings: Any) -> AsyncIterator[Served]:
    """An in-process gateway; stopped (sockets, session, server) on exit.

    Prompts still running at the end get a short grace: tests do not wait for them.
    """
    settings.setdefault("shutdown_grace", 0.2)
    server, gateway = await start_in_process(data_dir, **settings)
    session = aiohttp.ClientSession()
    served = Served(server, gateway, session, data_dir)
    try:
        yield served
    finally:
        for sock in served.sockets:
            await sock.close()
        await session.close()
        await server.close()


# -- prompts ------------------------------------------------------------------------


def sleep_prompt(
    seconds: float,
    color: int = 0,
    *,
    node: str = "Sleep",
    output: str = "PreviewImage",
    prefix: str = "ComfyUI",
) -> dict[str, Any]:
    """EmptyImage(8x8, color) -> Sleep/TestSleep(seconds) -> PreviewImage/SaveImage."""
    out_inputs: dict[str, Any] = {"images": ["2", 0]}
    if output == "SaveImage":
        out_inputs["filename_prefix"] = prefix
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": node, "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": output, "inputs": out_inputs},
    }


def save_prompt(color: int, prefix: str) -> dict[str, Any]:
    """EmptyImage(8x8, color) -> SaveImage(prefix): quick, one output file."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def binary_prompt(color: int = 0, images: int = 3) -> dict[str, Any]:
    """Binary frames among the JSON ones: EmptyImage(8x8, `images` of them) ->
    GetImageSize (progress text) -> PreviewAny, and -> Sleep(0.2) -> SaveImageWebsocket
    (a preview frame per image)."""
    prompt = sleep_prompt(0.2, color)
    prompt["1"]["inputs"]["batch_size"] = images
    prompt["3"] = {"class_type": "SaveImageWebsocket", "inputs": {"images": ["2", 0]}}
    prompt["4"] = {"class_type": "GetImageSize", "inputs": {"image": ["1", 0]}}
    prompt["5"] = {"class_type": "PreviewAny", "inputs": {"source": ["4", 2]}}
    return prompt


def preview_prompt(steps: int) -> dict[str, Any]:
    """A sampler's kind of previews: EmptyImage -> Progress(`steps`, a preview with each
    step) -> PreviewAny, and -> GetImageSize (progress text) -> PreviewAny."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {
            "class_type": "Progress",
            "inputs": {
                "value": ["1", 0],
                "steps": steps,
                "seconds_per_step": 0.0,
                "previews": True,
            },
        },
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        "4": {"class_type": "GetImageSize", "inputs": {"image": ["1", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 2]}},
    }


def client_frames(sock: Socket) -> list[Received]:
    """What a socket got besides the queue's `status` and the subscription acks: the
    frames of its prompts, JSON and binary, in order."""
    skipped = ("status", "feature_flags", "subscribed", "unsubscribed", "subscribe_error")
    return [f for f in sock.frames if f.type not in skipped]
