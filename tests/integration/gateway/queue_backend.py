"""A ComfyUI backend on loopback that queues and runs prompts one at a time, as ComfyUI
does, on a thread of its own (the gateways under test are child processes).

Like ComfyUI, it sends a prompt's frames to the socket of the `clientId` the prompt was
queued with, whichever socket holds that id when the frame goes out. Nothing in it runs
a node: a prompt takes its Sleep node's `seconds`. It records, from its side, which
gateway (by User-Agent) sent each prompt and opened each socket, and how often each
prompt ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from comfyfleet.nodes import build_registry
from tests.loopback_comfyui import LoopbackComfyUI

AGENT = re.compile(r"gateway ([A-Za-z0-9._-]+)")
CLASSES = ("EmptyImage", "Sleep", "PreviewImage")


def gateway_of(request: web.Request) -> str:
    found = AGENT.search(request.headers.get("User-Agent", ""))
    return found.group(1) if found else "?"


@dataclass
class Queued:
    number: int
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]

    def item(self) -> list[Any]:
        return [self.number, self.prompt_id, self.prompt, self.extra_data, []]


@dataclass
class QueueBackend(LoopbackComfyUI):
    name: str = "backend"
    submits: list[tuple[float, str, str]] = field(default_factory=list)  # (at, gateway, id)
    sockets: list[tuple[float, str]] = field(default_factory=list)  # (at, gateway), opened
    runs: Counter[str] = field(default_factory=Counter)  # prompt id -> times it ran
    interrupts: list[str] = field(default_factory=list)
    _history: dict[str, Any] = field(default_factory=dict)
    _pending: list[Queued] = field(default_factory=list)
    _running: Queued | None = None
    _open: dict[str, web.WebSocketResponse] = field(default_factory=dict)  # by clientId
    _open_by: dict[str, str] = field(default_factory=dict)  # clientId -> its gateway
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _work: asyncio.Event | None = None
    _number: int = 0

    # -- life cycle (from the test's thread) -------------------------------------------

    def start(self) -> QueueBackend:
        started = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.run_until_complete(self._start())
            started.set()
            loop.run_forever()
            self._worker_task.cancel()
            loop.run_until_complete(asyncio.gather(self._worker_task, return_exceptions=True))
            loop.run_until_complete(self.stop_serving())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"backend-{self.name}", daemon=True)
        self._thread.start()
        assert started.wait(10), "the backend did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def open_sockets(self) -> list[str]:
        """The gateways whose sockets are open now."""
        return sorted(self._open_by[c] for c, ws in list(self._open.items()) if not ws.closed)

    def submitters(self) -> list[str]:
        """The gateways that sent prompts here, in turn: each change of sender once."""
        turns: list[str] = []
        for _, gateway, _ in list(self.submits):
            if not turns or turns[-1] != gateway:
                turns.append(gateway)
        return turns

    async def _start(self) -> None:
        self._work = asyncio.Event()
        registry = build_registry(testing=True)
        self._info: dict[str, Any] = {}
        for class_type in CLASSES:
            self._info.update(registry.object_info(class_type))
        await self.serve(self.comfyui_app())
        self._worker_task = asyncio.get_running_loop().create_task(self._worker())

    # -- routes ----------------------------------------------------------------------

    async def _object_info(self, _request: web.Request) -> web.Response:
        return web.json_response(self._info)

    async def _prompt_info(self, _request: web.Request) -> web.Response:
        remaining = len(self._pending) + (self._running is not None)
        return web.json_response({"exec_info": {"queue_remaining": remaining}})

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt_id = str(body["prompt_id"])
        self.submits.append((time.time(), gateway_of(request), prompt_id))
        extra = {**body.get("extra_data", {}), "client_id": body.get("client_id")}
        self._number += 1
        self._pending.append(Queued(self._number, prompt_id, body["prompt"], extra))
        assert self._work is not None
        self._work.set()
        answer = {"prompt_id": prompt_id, "number": self._number, "node_errors": {}}
        return web.json_response(answer)

    async def _queue(self, _request: web.Request) -> web.Response:
        running = [self._running.item()] if self._running is not None else []
        pending = [queued.item() for queued in self._pending]
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def _ok(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        if request.path == "/queue":
            gone = set(body.get("delete", []))
            self._pending = [q for q in self._pending if q.prompt_id not in gone]
        elif request.path == "/interrupt":
            self.interrupts.append(str(body.get("prompt_id")))
        return web.Response(status=200)

    async def _view(self, _request: web.Request) -> web.Response:
        return web.Response(status=404)

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        client_id = request.rel_url.query.get("clientId", "")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append((time.time(), gateway_of(request)))
        self._open[client_id] = ws
        self._open_by[client_id] = gateway_of(request)
        status = {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client_id}
        await ws.send_json({"type": "status", "data": status})
        try:
            async for _message in ws:
                pass
        finally:
            if self._open.get(client_id) is ws:
                del self._open[client_id]
        return ws

    # -- the worker ----------------------------------------------------------------------

    async def _send(self, client_id: str, type_: str, data: dict[str, Any]) -> None:
        ws = self._open.get(client_id)
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError):
                await ws.send_json({"type": type_, "data": data})

    async def _worker(self) -> None:
        assert self._work is not None
        while True:
            if not self._pending:
                self._work.clear()
                await self._work.wait()
                continue
            queued = self._running = self._pending.pop(0)
            self.runs[queued.prompt_id] += 1
            await self._run(queued)
            self._running = None

    async def _run(self, queued: Queued) -> None:
        prompt_id, client = queued.prompt_id, str(queued.extra_data.get("client_id"))
        seconds = float(queued.prompt["2"]["inputs"]["seconds"])
        started = time.time()
        await self._send(client, "execution_start", {"prompt_id": prompt_id})
        await self._send(client, "executing", {"node": "2", "prompt_id": prompt_id})
        await asyncio.sleep(seconds)
        messages: list[list[Any]] = [
            ["execution_start", {"prompt_id": prompt_id, "timestamp": int(started * 1000)}],
            ["execution_success", {"prompt_id": prompt_id, "timestamp": int(time.time() * 1000)}],
        ]
        await self._send(client, "execution_success", messages[1][1])
        status = {"status_str": "success", "completed": True, "messages": messages}
        self._history[prompt_id] = {"prompt": queued.item(), "outputs": {}, "status": status}
        await self._send(client, "executing", {"node": None, "prompt_id": prompt_id})
