"""Many simulated ComfyUI 0.3.64 backends in one process, for the fleet scale benchmark.

Each backend is its own aiohttp app, runner and loopback port, with its own state: one
execution slot (a FIFO queue, one prompt at a time, as a ComfyUI process runs them), its
history, its WebSockets and the record of its runs. A backend answers what a
comfyfleet gateway's ComfyUI lane calls, with ComfyUI's shapes: `/object_info`,
`/prompt`, `/queue`, `/interrupt`, `/history`, `/ws`, `/system_stats`, `/models`,
`/embeddings`, `/features`, `/view` (404: no prompt makes files) and the same under
`/api`; a companion-pack probe (`/comfyfleet/pack`) gets a plain ComfyUI's 404.

The nodes: `Sleep` (sleeps `seconds`, with asyncio.sleep: no CPU), `PreviewAny` (the
output node), `PrimitiveInt` and `PrimitiveFloat`. A prompt takes the sum of its Sleep
nodes' `seconds`. Its frames go to its client_id's socket in ComfyUI's order:
`execution_start`, `execution_cached`, per node `executing` (and `executed` for the
output node), `execution_success`; then the history entry is written, `status` is
broadcast, and the done signal `executing {node: null}` follows. (The `progress_state`
frames a real ComfyUI also sends are left out.)

`GET /sim/runs` (not ComfyUI's) lists the backend's runs: `[{prompt_id, start, end,
status}]`, times from time.time().

    .venv/bin/python bench/comfyui_sim.py --count N --ready-file PATH [--host 127.0.0.1]

The base URLs, one per line, are written to the ready file once every backend listens;
it serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import resource
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

VERSION = "0.3.64"
#: ComfyUI's cap on kept history entries (MAXIMUM_HISTORY_SIZE).
MAX_HISTORY = 10_000
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
FEATURES = {"supports_preview_metadata": True, "max_upload_size": 104857600}

NODES: dict[str, dict[str, Any]] = {
    "Sleep": {
        "input": {
            "required": {
                "seconds": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 3600.0, "step": 0.01}]
            },
            "optional": {"value": ["*", {}]},
        },
        "input_order": {"required": ["seconds"], "optional": ["value"]},
        "output": ["FLOAT"],
        "output_is_list": [False],
        "output_name": ["FLOAT"],
        "name": "Sleep",
        "display_name": "Sleep",
        "description": "Sleeps `seconds`, then passes `value` on (or the seconds).",
        "python_module": "custom_nodes.comfyui_sim",
        "category": "_for_testing",
        "output_node": False,
    },
    "PreviewAny": {
        "input": {"required": {"source": ["*", {}]}},
        "input_order": {"required": ["source"]},
        "output": [],
        "output_is_list": [],
        "output_name": [],
        "name": "PreviewAny",
        "display_name": "Preview Any",
        "description": "",
        "python_module": "comfy_extras.nodes_preview_any",
        "category": "utils",
        "output_node": True,
    },
    "PrimitiveInt": {
        "input": {
            "required": {
                "value": ["INT", {"min": -9223372036854775807, "max": 9223372036854775807}]
            }
        },
        "input_order": {"required": ["value"]},
        "output": ["INT"],
        "output_is_list": [False],
        "output_name": ["INT"],
        "output_tooltips": [None],
        "name": "PrimitiveInt",
        "display_name": "Int",
        "description": "",
        "python_module": "comfy_extras.nodes_primitive",
        "category": "utils/primitive",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
    "PrimitiveFloat": {
        "input": {
            "required": {
                "value": ["FLOAT", {"min": -9223372036854775807, "max": 9223372036854775807}]
            }
        },
        "input_order": {"required": ["value"]},
        "output": ["FLOAT"],
        "output_is_list": [False],
        "output_name": ["FLOAT"],
        "output_tooltips": [None],
        "name": "PrimitiveFloat",
        "display_name": "Float",
        "description": "",
        "python_module": "comfy_extras.nodes_primitive",
        "category": "utils/primitive",
        "output_node": False,
        "deprecated": False,
        "experimental": False,
        "api_node": False,
    },
}
OUTPUT_NODES = frozenset(name for name, info in NODES.items() if info["output_node"])

# Computed once, served by every backend.
OBJECT_INFO = json.dumps(NODES).encode()
OBJECT_INFO_ONE = {name: json.dumps({name: info}).encode() for name, info in NODES.items()}
SYSTEM_STATS = json.dumps(
    {
        "system": {
            "os": os.name,
            "ram_total": 0,
            "ram_free": 0,
            "comfyui_version": VERSION,
            "required_frontend_version": "1.27.10",
            "installed_templates_version": "0.1.95",
            "required_templates_version": "0.1.95",
            "python_version": sys.version,
            "pytorch_version": "2.8.0+cpu",
            "embedded_python": False,
            "argv": ["main.py", "--cpu"],
        },
        "devices": [
            {
                "name": "cpu",
                "type": "cpu",
                "index": None,
                "vram_total": 0,
                "vram_free": 0,
                "torch_vram_total": 0,
                "torch_vram_free": 0,
            }
        ],
    }
).encode()
FEATURES_JSON = json.dumps(FEATURES).encode()
EMPTY_LIST = b"[]"


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error(type_: str, message: str, details: str = "") -> dict[str, Any]:
    return {"type": type_, "message": message, "details": details, "extra_info": {}}


def _is_link(value: Any) -> bool:
    return (
        isinstance(value, list) and len(value) == 2 and isinstance(value[0], str | int)
    ) and isinstance(value[1], int)


class Interrupted(Exception):
    def __init__(self, node_id: str, node_type: str) -> None:
        super().__init__(node_id)
        self.node_id, self.node_type = node_id, node_type


def execution_order(prompt: dict[str, Any], outputs: list[str]) -> list[str]:
    """The nodes the outputs need, inputs first (each once)."""
    order: list[str] = []
    seen: set[str] = set()
    for output in outputs:
        stack: list[tuple[str, bool]] = [(output, False)]
        while stack:
            node_id, expanded = stack.pop()
            if expanded:
                order.append(node_id)
                continue
            if node_id in seen or node_id not in prompt:
                continue
            seen.add(node_id)
            stack.append((node_id, True))
            inputs = prompt[node_id].get("inputs") or {}
            for value in reversed(list(inputs.values())):
                if _is_link(value) and str(value[0]) not in seen:
                    stack.append((str(value[0]), False))
    return order


def validate(
    prompt: Any, targets: list[str] | None
) -> tuple[dict[str, Any] | None, list[str], dict[str, Any]]:
    """(error, outputs to execute, node_errors), after ComfyUI's validate_prompt: every
    node needs a known class_type; each output's nodes their required inputs."""
    if not isinstance(prompt, dict):
        return _error("invalid_prompt", "Prompt must be a dict"), [], {}
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            message = "Cannot execute because a node is missing the class_type property."
            return _error("invalid_prompt", message, f"Node ID '#{node_id}'"), [], {}
        if node["class_type"] not in NODES:
            message = f"Cannot execute because node {node['class_type']} does not exist."
            return _error("invalid_prompt", message, f"Node ID '#{node_id}'"), [], {}
    outputs = [n for n, node in prompt.items() if node["class_type"] in OUTPUT_NODES]
    if targets is not None:
        outputs = [n for n in outputs if n in {str(t) for t in targets}]
    if not outputs:
        return _error("prompt_no_outputs", "Prompt has no outputs"), [], {}
    node_errors: dict[str, Any] = {}
    good = []
    for output in outputs:
        failed = False
        for node_id in execution_order(prompt, [output]):
            node = prompt[node_id]
            given = node.get("inputs") or {}
            missing = [
                name for name in NODES[node["class_type"]]["input"]["required"] if name not in given
            ]
            for name in missing:
                failed = True
                entry = node_errors.setdefault(
                    node_id,
                    {"errors": [], "dependent_outputs": [], "class_type": node["class_type"]},
                )
                entry["errors"].append(
                    {
                        "type": "required_input_missing",
                        "message": "Required input is missing",
                        "details": name,
                        "extra_info": {"input_name": name},
                    }
                )
                if output not in entry["dependent_outputs"]:
                    entry["dependent_outputs"].append(output)
        if not failed:
            good.append(output)
    if not good:
        return (
            _error("prompt_outputs_failed_validation", "Prompt outputs failed validation"),
            ([]),
            node_errors,
        )
    return None, good, node_errors


def _preview_text(value: Any) -> str:
    """PreviewAny's text of a value."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float | bool):
        return str(value)
    if value is None:
        return "None"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


class SimBackend:
    """One simulated ComfyUI process: its queue, its one execution slot, its sockets."""

    def __init__(self) -> None:
        self.number = 0  # the queue counter: advances on every POST /prompt
        self.pending: list[tuple[float, str, list[Any]]] = []  # a heap, as ComfyUI's
        self.running: list[Any] | None = None  # the queue item being executed
        self.current_node: str | None = None
        self.history: dict[str, Any] = {}
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.runs: list[dict[str, Any]] = []
        self.arrived: dict[str, float] = {}  # prompt id -> when its POST /prompt came
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._interrupt = False

    # -- app -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("", "/api"):
            add_get, add_post = app.router.add_get, app.router.add_post
            add_get(prefix + "/object_info", self.object_info)
            add_get(prefix + "/object_info/{node_class}", self.object_info_one)
            add_get(prefix + "/prompt", self.prompt_info)
            add_post(prefix + "/prompt", self.submit)
            add_get(prefix + "/queue", self.queue)
            add_post(prefix + "/queue", self.queue_change)
            add_post(prefix + "/interrupt", self.interrupt)
            add_get(prefix + "/history", self.history_all)
            add_get(prefix + "/history/{prompt_id}", self.history_of)
            add_post(prefix + "/history", self.history_change)
            add_get(prefix + "/system_stats", self.system_stats)
            add_get(prefix + "/models", self.models)
            add_get(prefix + "/models/{folder}", self.not_found)
            add_get(prefix + "/embeddings", self.models)
            add_get(prefix + "/features", self.features)
            add_get(prefix + "/view", self.not_found)
        app.router.add_get("/ws", self.ws)
        app.router.add_get("/sim/runs", self.sim_runs)
        return app

    # -- plain answers -----------------------------------------------------------------

    async def object_info(self, _request: web.Request) -> web.Response:
        return _json(OBJECT_INFO)

    async def object_info_one(self, request: web.Request) -> web.Response:
        return _json(OBJECT_INFO_ONE.get(request.match_info["node_class"], b"{}"))

    async def system_stats(self, _request: web.Request) -> web.Response:
        return _json(SYSTEM_STATS)

    async def models(self, _request: web.Request) -> web.Response:
        return _json(EMPTY_LIST)

    async def features(self, _request: web.Request) -> web.Response:
        return _json(FEATURES_JSON)

    async def not_found(self, _request: web.Request) -> web.Response:
        return web.Response(status=404)

    async def sim_runs(self, _request: web.Request) -> web.Response:
        return web.json_response(self.runs)

    # -- the queue ---------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return len(self.pending) + (self.running is not None)

    def _status(self, sid: str | None = None) -> str:
        data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": self.remaining}}}
        if sid is not None:
            data["sid"] = sid
        return json.dumps({"type": "status", "data": data})

    async def prompt_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"exec_info": {"queue_remaining": self.remaining}})

    async def submit(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400)
        if not isinstance(body, dict):
            body = {}
        if "number" in body:
            number: float = float(body["number"])
        else:
            number = -self.number if body.get("front") else self.number
            self.number += 1
        if "prompt" not in body:
            missing = _error("no_prompt", "No prompt provided", "No prompt provided")
            return web.json_response({"error": missing, "node_errors": {}}, status=400)
        prompt = body["prompt"]
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        targets = body.get("partial_execution_targets")
        error, outputs, node_errors = validate(prompt, targets)
        extra_data = body.get("extra_data")
        extra_data = dict(extra_data) if isinstance(extra_data, dict) else {}
        if "client_id" in body:
            extra_data["client_id"] = body["client_id"]
        if error is not None:
            return web.json_response({"error": error, "node_errors": node_errors}, status=400)
        for key in SENSITIVE_EXTRA_DATA_KEYS:
            extra_data.pop(key, None)
        item = [number, prompt_id, prompt, extra_data, outputs]
        self.arrived[prompt_id] = time.time()
        heapq.heappush(self.pending, (number, prompt_id, item))
        self._broadcast(self._status())
        self._start_next()
        return web.json_response(
            {"prompt_id": prompt_id, "number": number, "node_errors": node_errors}
        )

    async def queue(self, _request: web.Request) -> web.Response:
        running = [self.running] if self.running is not None else []
        pending = [entry[2] for entry in self.pending]
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def queue_change(self, request: web.Request) -> web.Response:
        body = await _json_or_empty(request)
        changed = False
        if body.get("clear"):
            self.pending.clear()
            changed = True
        if isinstance(body.get("delete"), list):
            gone = {str(i) for i in body["delete"]}
            kept = [entry for entry in self.pending if entry[1] not in gone]
            if len(kept) != len(self.pending):
                heapq.heapify(kept)
                self.pending = kept
                changed = True
        if changed:
            self._broadcast(self._status())
        return web.Response(status=200)

    async def interrupt(self, request: web.Request) -> web.Response:
        body = await _json_or_empty(request)
        prompt_id = body.get("prompt_id")
        if self.running is not None and (not prompt_id or prompt_id == self.running[1]):
            self._interrupt = True
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(None)
        return web.Response(status=200)

    # -- history -----------------------------------------------------------------------

    async def history_of(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        return web.json_response({prompt_id: entry} if entry is not None else {})

    async def history_all(self, request: web.Request) -> web.Response:
        try:
            max_items = int(request.query["max_items"]) if "max_items" in request.query else None
            offset = int(request.query.get("offset", -1))
        except ValueError:
            return web.Response(status=400)
        if offset < 0 and max_items is not None:
            offset = len(self.history) - max_items
        found: dict[str, Any] = {}
        for i, (key, entry) in enumerate(self.history.items()):
            if i >= offset:
                found[key] = entry
                if max_items is not None and len(found) >= max_items:
                    break
        return web.json_response(found)

    async def history_change(self, request: web.Request) -> web.Response:
        body = await _json_or_empty(request)
        if body.get("clear"):
            self.history.clear()
        for prompt_id in body.get("delete") or []:
            self.history.pop(str(prompt_id), None)
        return web.Response(status=200)

    # -- WebSocket ---------------------------------------------------------------------

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        sid = request.query.get("clientId") or uuid.uuid4().hex
        self.sockets[sid] = ws
        try:
            await ws.send_str(self._status(sid))
            # A client reconnecting while its prompt runs hears the node it is at.
            running = self.running
            if running is not None and running[3].get("client_id") == sid and self.current_node:
                await ws.send_str(
                    json.dumps({"type": "executing", "data": {"node": self.current_node}})
                )
            first = True
            async for message in ws:
                if message.type == WSMsgType.TEXT and first:
                    with contextlib.suppress(ValueError):
                        frame = json.loads(message.data)
                        if isinstance(frame, dict) and frame.get("type") == "feature_flags":
                            reply = {"type": "feature_flags", "data": FEATURES}
                            await ws.send_str(json.dumps(reply))
                first = False
        finally:
            if self.sockets.get(sid) is ws:
                del self.sockets[sid]
        return ws

    def _send(self, sid: str | None, kind: str, data: dict[str, Any]) -> None:
        """A frame to `sid`'s socket, or to every socket when `sid` is None."""
        text = json.dumps({"type": kind, "data": data})
        if sid is None:
            self._broadcast(text)
            return
        ws = self.sockets.get(sid)
        if ws is not None:
            _push(ws, text)

    def _broadcast(self, text: str) -> None:
        for ws in list(self.sockets.values()):
            _push(ws, text)

    # -- execution ---------------------------------------------------------------------

    def _start_next(self) -> None:
        if self.running is None and self.pending and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._worker())

    async def _worker(self) -> None:
        try:
            while self.pending:
                _, _, item = heapq.heappop(self.pending)
                self.running = item
                self._broadcast(self._status())  # taken by the worker
                await self._execute(item)
        finally:
            self.running = None
            self.current_node = None
            self._task = None

    async def _execute(self, item: list[Any]) -> None:
        number, prompt_id, prompt, extra_data, outputs = item
        sid = extra_data.get("client_id")
        self._interrupt = False
        messages: list[list[Any]] = []

        def event(kind: str, data: dict[str, Any], *, broadcast: bool = False) -> None:
            """A prompt event: to its client (to all, unless only to a client_id, when
            `broadcast`), and kept for the history entry's status messages."""
            messages.append([kind, data])
            if sid is not None or broadcast:
                self._send(sid, kind, data)

        start = time.time()
        event("execution_start", {"prompt_id": prompt_id, "timestamp": int(start * 1000)})
        event("execution_cached", {"nodes": [], "prompt_id": prompt_id, "timestamp": _now_ms()})
        values: dict[str, Any] = {}
        ui: dict[str, Any] = {}
        executed: list[str] = []
        status = "success"
        try:
            for node_id in execution_order(prompt, outputs):
                node = prompt[node_id]
                class_type = node["class_type"]
                if self._interrupt:
                    raise Interrupted(node_id, class_type)
                self.current_node = node_id
                if sid is not None:
                    data = {"node": node_id, "display_node": node_id, "prompt_id": prompt_id}
                    self._send(sid, "executing", data)
                inputs = {
                    name: values.get(str(value[0])) if _is_link(value) else value
                    for name, value in (node.get("inputs") or {}).items()
                }
                if class_type == "Sleep":
                    seconds = inputs.get("seconds")
                    seconds = float(seconds) if isinstance(seconds, int | float) else 0.0
                    await self._sleep(seconds)
                    if self._interrupt:
                        raise Interrupted(node_id, class_type)
                    values[node_id] = inputs.get("value", seconds)
                elif class_type == "PreviewAny":
                    ui[node_id] = {"text": [_preview_text(inputs.get("source"))]}
                    if sid is not None:
                        data = {
                            "node": node_id,
                            "display_node": node_id,
                            "output": ui[node_id],
                            "prompt_id": prompt_id,
                        }
                        self._send(sid, "executed", data)
                else:
                    values[node_id] = inputs.get("value")
                executed.append(node_id)
            end = time.time()
            event("execution_success", {"prompt_id": prompt_id, "timestamp": int(end * 1000)})
        except Interrupted as stop:
            end = time.time()
            status = "interrupted"
            data = {
                "prompt_id": prompt_id,
                "node_id": stop.node_id,
                "node_type": stop.node_type,
                "executed": executed,
                "timestamp": int(end * 1000),
            }
            event("execution_interrupted", data, broadcast=True)
        self.current_node = None
        arrived = self.arrived.pop(prompt_id, start)
        run = {"prompt_id": prompt_id, "arrived": arrived, "start": start, "end": end}
        self.runs.append({**run, "status": status})
        meta = {
            n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n} for n in ui
        }
        self.history[prompt_id] = {
            "prompt": [number, prompt_id, prompt, extra_data, outputs],
            "outputs": ui,
            "status": {
                "status_str": "success" if status == "success" else "error",
                "completed": status == "success",
                "messages": messages,
            },
            "meta": meta if status == "success" else {},
        }
        if len(self.history) > MAX_HISTORY:
            del self.history[next(iter(self.history))]
        self.running = None
        self._broadcast(self._status())
        if sid is not None:  # the done signal: after the history entry is written
            self._send(sid, "executing", {"node": None, "prompt_id": prompt_id})

    async def _sleep(self, seconds: float) -> None:
        """Sleep; an interrupt wakes it early."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        self._wake = wake

        def wake_up() -> None:
            if not wake.done():
                wake.set_result(None)

        timer = loop.call_later(seconds, wake_up)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for ws in list(self.sockets.values()):
            with contextlib.suppress(Exception):
                await ws.close()


def _push(ws: web.WebSocketResponse, text: str) -> None:
    """Send without waiting for the socket: frames of one socket keep their order (one
    task per frame, started in order; aiohttp's writer sends them in that order)."""
    if ws.closed:
        return
    task = asyncio.get_running_loop().create_task(_send_quietly(ws, text))
    _SENDING.add(task)
    task.add_done_callback(_SENDING.discard)


_SENDING: set[asyncio.Task[None]] = set()


async def _send_quietly(ws: web.WebSocketResponse, text: str) -> None:
    with contextlib.suppress(Exception):  # the client went away: nothing to tell it
        await ws.send_str(text)


async def _json_or_empty(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def raise_open_files_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


async def serve(count: int, host: str, ready_file: Path) -> None:
    limit = raise_open_files_limit()
    started = time.monotonic()
    backends = [SimBackend() for _ in range(count)]
    runners: list[web.AppRunner] = []
    urls = []
    try:
        for backend in backends:
            runner = web.AppRunner(
                backend.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
            )
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, 0, backlog=512)
            await site.start()
            port = runner.addresses[0][1]
            urls.append(f"http://{host}:{port}")
        partial = ready_file.with_name(ready_file.name + ".partial")
        partial.write_text("".join(url + "\n" for url in urls))
        os.replace(partial, ready_file)
        print(
            f"comfyui_sim: {count} backends on {host} in {time.monotonic() - started:.1f} s "
            f"(open files limit {limit})",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await asyncio.gather(*(b.close() for b in backends), return_exceptions=True)
        await asyncio.gather(*(r.cleanup() for r in runners), return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, required=True, help="backends to simulate")
    parser.add_argument("--ready-file", type=Path, required=True, help="where to list the urls")
    parser.add_argument("--host", default="127.0.0.1")
    options = parser.parse_args()
    coroutine = serve(options.count, options.host, options.ready_file)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


if __name__ == "__main__":
    main()
