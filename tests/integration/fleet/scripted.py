"""A scripted ComfyUI backend on loopback: it speaks the protocol a ComfyUI lane uses
(`/object_info`, `/models`, `/prompt`, `/ws`, `/queue`, `/interrupt`, `/history/{id}`,
`/view`) and reports whatever outputs a test tells it to, with bytes of its choosing.

It plays a hostile (or broken) backend: nothing in it runs a node. Every prompt
"runs" at once: `execution_start`, one `executed` per scripted output, then
`execution_success` and the done signal; its history holds the same outputs unless
`history_outputs` says otherwise. Each `/view` it answers is recorded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from comfyfleet.nodes import build_registry
from tests.loopback_comfyui import LoopbackComfyUI

#: What `/view` answers for every file: bytes the backend chose.
PAYLOAD = b"\x89PNG-not-really: bytes a backend chose"


def _node_info(*class_types: str) -> dict[str, Any]:
    registry = build_registry()
    info: dict[str, Any] = {}
    for class_type in class_types:
        info.update(registry.object_info(class_type))
    return info


@dataclass
class ScriptedBackend(LoopbackComfyUI):
    outputs: dict[str, Any] = field(default_factory=dict)  # node id -> UI output
    history_outputs: dict[str, Any] | None = None  # None: the same as `outputs`
    class_types: tuple[str, ...] = ("EmptyImage", "SaveImage")
    views: list[dict[str, str]] = field(default_factory=list)  # every /view query
    junk: tuple[str, ...] = ()  # text frames sent before a prompt's own, as they are
    announced_size: int | None = None  # a /view answer's Content-Length, true or not
    # Its web extensions: `/extensions` lists these entries, and each `pack/path` in
    # `web_files` is served at `/extensions/pack/path`.
    extensions: list[str] = field(default_factory=list)
    web_files: dict[str, bytes] = field(default_factory=dict)
    prompts: list[str] = field(default_factory=list)  # prompt ids, as submitted
    _history: dict[str, Any] = field(default_factory=dict)
    _sockets: list[web.WebSocketResponse] = field(default_factory=list)
    _server: TestServer | None = None

    async def start(self) -> ScriptedBackend:
        app = self.comfyui_app()
        app.router.add_get("/extensions", self._extensions)
        app.router.add_get("/extensions/{path:.*}", self._web_file)
        await self.serve(app)
        return self

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await self.stop_serving()

    # -- routes ------------------------------------------------------------------

    async def _object_info(self, _request: web.Request) -> web.Response:
        return web.json_response(_node_info(*self.class_types))

    async def _prompt_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"exec_info": {"queue_remaining": 0}})

    async def _view(self, request: web.Request) -> web.StreamResponse:
        self.views.append(dict(request.rel_url.query))
        if self.announced_size is None:
            return web.Response(body=PAYLOAD, content_type="image/png")
        answer = web.StreamResponse(headers={"Content-Type": "image/png"})
        answer.content_length = self.announced_size
        await answer.prepare(request)
        await answer.write(PAYLOAD)  # and no more: the size announced is never sent
        return answer

    async def _extensions(self, _request: web.Request) -> web.Response:
        return web.json_response(self.extensions)

    async def _web_file(self, request: web.Request) -> web.Response:
        body = self.web_files.get(request.match_info["path"])
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="text/html")  # what it claims is no matter

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {}}}})
        try:
            async for _message in ws:
                pass  # feature flags: nothing to answer
        finally:
            self._sockets.remove(ws)
        return ws

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt_id = body.get("prompt_id") or str(uuid.uuid4())
        self.prompts.append(prompt_id)
        asyncio.get_running_loop().create_task(self._run(prompt_id))
        return web.json_response({"prompt_id": prompt_id, "number": 0, "node_errors": {}})

    # -- a prompt's "run" ------------------------------------------------------------

    async def _send(self, kind: str, data: dict[str, Any]) -> None:
        for ws in list(self._sockets):
            await ws.send_json({"type": kind, "data": data})

    async def _run(self, prompt_id: str) -> None:
        await asyncio.sleep(0.01)  # the submit's answer goes first
        for text in self.junk:
            for ws in list(self._sockets):
                await ws.send_str(text)
        stamp = int(time.time() * 1000)
        await self._send("execution_start", {"prompt_id": prompt_id, "timestamp": stamp})
        for node, ui in self.outputs.items():
            meta = {"node": node, "display_node": node, "prompt_id": prompt_id}
            await self._send("executing", meta)
            await self._send("executed", {**meta, "output": ui})
        success = {"prompt_id": prompt_id, "timestamp": stamp}
        outputs = self.outputs if self.history_outputs is None else self.history_outputs
        self._history[prompt_id] = {
            "prompt": [0, prompt_id, {}, {}, list(outputs)],
            "outputs": outputs,
            "status": {
                "status_str": "success",
                "completed": True,
                "messages": [
                    ["execution_start", {"prompt_id": prompt_id, "timestamp": stamp}],
                    ["execution_success", success],
                ],
            },
            "meta": {},
        }
        await self._send("execution_success", success)
        await self._send("executing", {"node": None, "prompt_id": prompt_id})
