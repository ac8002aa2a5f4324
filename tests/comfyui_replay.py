"""A ComfyUI backend on loopback that answers as a recorded real ComfyUI 0.3.64 did.

It plays the cases in `tests/data/comfyui-fleet/` (recorded by
`conformance/record_cases.py`): the object_info of their classes, ComfyUI's answer
to `POST /prompt` for each case's prompt, and for an accepted prompt every frame
ComfyUI sent (to the client that submitted it, under the new prompt id), then its
history entry and output files. With `pack`, it also answers as the companion pack
did (`/comfyfleet/pack`, `/comfyfleet/validate`). Nothing in it runs a node.

A prompt is matched to a case by its class types (each case uses its own set).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.loopback_comfyui import LoopbackComfyUI

CASES_DIR = Path(__file__).parent / "data" / "comfyui-fleet"


def load_case(name: str) -> dict[str, Any]:
    case: dict[str, Any] = json.loads((CASES_DIR / f"{name}.json").read_text("utf-8"))
    return case


def case_prompt(name: str) -> dict[str, Any]:
    prompt: dict[str, Any] = load_case(name)["submit"]["request"]["prompt"]
    return prompt


def _signature(prompt: Any) -> tuple[tuple[str, int], ...]:
    nodes = prompt.values() if isinstance(prompt, dict) else []
    counts = Counter(str(node.get("class_type")) for node in nodes if isinstance(node, dict))
    return tuple(sorted(counts.items()))


def _renamed(value: Any, old: str, new: str) -> Any:
    """`value` with every occurrence of the recorded prompt id replaced."""
    return json.loads(json.dumps(value).replace(old, new))


@dataclass
class ComfyUIReplay(LoopbackComfyUI):
    cases: tuple[str, ...]
    pack: bool = False
    submits: list[dict[str, Any]] = field(default_factory=list)  # POST /prompt bodies
    validations: list[dict[str, Any]] = field(default_factory=list)
    _loaded: dict[tuple[tuple[str, int], ...], dict[str, Any]] = field(default_factory=dict)
    _history: dict[str, Any] = field(default_factory=dict)
    _files: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    _sockets: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    _running: list[str] = field(default_factory=list)
    _server: TestServer | None = None

    async def start(self) -> ComfyUIReplay:
        for name in self.cases:
            case = load_case(name)
            self._loaded[_signature(case["submit"]["request"]["prompt"])] = case
        app = self.comfyui_app()
        if self.pack:
            app.router.add_get("/comfyfleet/pack", self._pack)
            app.router.add_post("/comfyfleet/validate", self._validate)
        await self.serve(app)
        return self

    async def close(self) -> None:
        for ws in list(self._sockets.values()):
            await ws.close()
        await self.stop_serving()

    def _case_for(self, body: Any) -> dict[str, Any]:
        prompt = body.get("prompt") if isinstance(body, dict) else None
        case = self._loaded.get(_signature(prompt))
        if case is None:
            raise web.HTTPNotImplemented(text=f"no recorded case for {_signature(prompt)}")
        return case

    # -- routes ----------------------------------------------------------------------

    async def _object_info(self, _request: web.Request) -> web.Response:
        info: dict[str, Any] = {}
        for case in self._loaded.values():
            info.update(case["object_info"])
        return web.json_response(info)

    async def _prompt_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"exec_info": {"queue_remaining": len(self._running)}})

    async def _pack(self, _request: web.Request) -> web.Response:
        return web.json_response({"pack": "comfyfleet", "version": 1})

    async def _validate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.validations.append(body)
        recorded = self._case_for(body)["validate"]
        return web.json_response(recorded["body"], status=recorded["status"])

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.submits.append(body)
        case = self._case_for(body)
        recorded = case["submit"]
        if recorded["status"] != 200:
            return web.json_response(recorded["body"], status=recorded["status"])
        old_id = recorded["body"]["prompt_id"]
        prompt_id = str(body.get("prompt_id") or old_id)
        self._running.append(prompt_id)
        play = self._play(case, old_id, prompt_id, str(body.get("client_id")))
        asyncio.get_running_loop().create_task(play)
        return web.json_response(_renamed(recorded["body"], old_id, prompt_id))

    async def _view(self, request: web.Request) -> web.Response:
        query = request.rel_url.query
        key = (query.get("type", "output"), query.get("subfolder", ""), query.get("filename", ""))
        data = self._files.get(key)
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="image/png")

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        client_id = request.rel_url.query.get("clientId", "")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets[client_id] = ws
        status = {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client_id}
        await ws.send_json({"type": "status", "data": status})
        try:
            async for _message in ws:
                pass  # feature flags: the recorded frames are sent as recorded
        finally:
            self._sockets.pop(client_id, None)
        return ws

    # -- an accepted prompt ---------------------------------------------------------------

    async def _play(self, case: dict[str, Any], old_id: str, prompt_id: str, client: str) -> None:
        await asyncio.sleep(0.01)  # the submit's answer goes first
        ws = self._sockets.get(client)
        for frame in case["frames"][1:]:  # after the greeting
            if ws is None:
                continue
            if frame.get("binary"):
                await ws.send_bytes(base64.b64decode(frame["b64"]))
            else:
                await ws.send_json(_renamed(frame, old_id, prompt_id))
            if frame.get("type") == "executing" and frame["data"].get("node") is None:
                break
            if frame.get("type") in ("execution_success", "execution_error"):
                self._finish(case, old_id, prompt_id)
        self._finish(case, old_id, prompt_id)

    def _finish(self, case: dict[str, Any], old_id: str, prompt_id: str) -> None:
        """The history entry and files exist once the end is sent (as in ComfyUI, whose
        done signal follows the history write)."""
        if prompt_id in self._history:
            return
        self._history[prompt_id] = _renamed(case["history"], old_id, prompt_id)
        for key, data in case.get("files", {}).items():
            kind, rest = key.split("/", 1)
            subfolder, _, filename = rest.rpartition("/")
            self._files[(kind, subfolder, filename)] = base64.b64decode(data)
        if prompt_id in self._running:
            self._running.remove(prompt_id)
