"""The gateway's side of its workers: `GET /api/workers/connect`, one WebSocket per
worker, which carries the tunnel to its backend (comfyfleet.tunnel) and a few control
messages (JSON text):

    worker -> gateway   {"type": "hello", "name": "gpu-7", "slots": 1, "tunnel": 2}
                                               first, within 10 s
                        {"type": "beat"}       every 0.5 s: its last word is recorded
                        {"type": "drain"}      SIGTERM: take no new work
    gateway -> worker   {"type": "welcome", "lane": "worker-pool.gpu-7", "tunnel": 2,
                         "gateway": "gw-..."}
                        {"type": "drained"}    nothing of the worker's runs any more

A worker's lane is this gateway's own (like a managed backend's): a ComfyUI lane whose
URL is a loopback port of the gateway that leads through the tunnel. When the
connection drops, the lane's backend is down and what ran there is handled as for any
backend that went away; a worker that comes back under its name gets its lane again,
and one that stays away past `grace` has its lane removed.

How the connection ended tells how long what ran there waits: a connection that broke
(no close frame: the worker's process died, or something between reset it and the
worker saw that too) is given RETURN_WINDOW to come back, after which the worker has
let go of it (comfyfleet.workers.agent) and it runs elsewhere; a silent one (no pong)
waits out the backend's hold, as the worker may not know yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from comfyfleet.lanes.backend import BackendError, BackendSpec, WorkerLink
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.lanes.settings import HOLD_MARGIN
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.gateway import Gateway
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.server.workers.machine import machine_of
from comfyfleet.server.workers.shared_nodes import SharedNodes
from comfyfleet.tunnel.ends import (
    PROTOCOL,
    RETURN_WINDOW,
    Ending,
    GatewayEnd,
    WebSocketLike,
    carry,
    control_of,
)
from comfyfleet.tunnel.mux import MAX_MESSAGE, TunnelBroken
from comfyfleet.workers.tokens import NAME, WorkerToken, holder, reread

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0  # s for a connected worker to say who it is
HEARTBEAT = 5.0  # s between WebSocket pings; a worker silent for two is gone
MACHINE_EVERY = 60.0  # s between reads of a worker's devices and memory
MAX_SLOTS = 256
PREFIX = "worker-"


@dataclass
class Worker:
    name: str  # its lane's backend name: worker-<token name>[.<worker's own name>]
    end: GatewayEnd
    lane: ComfyUILane
    token: WorkerToken
    link: WorkerLink  # also the lane's: what the dashboard shows
    ws: WebSocketLike | None = None
    leaving: asyncio.Task[None] | None = field(default=None, repr=False)
    telling: asyncio.Task[None] | None = field(default=None, repr=False)
    reading: asyncio.Task[None] | None = field(default=None, repr=False)  # its machine
    machine_at: float = -math.inf  # time.monotonic() its machine was last read


class WorkerHub:
    def __init__(self, gateway: Gateway, tokens: Sequence[WorkerToken], grace: float) -> None:
        self.gw = gateway
        self._configured = tuple(tokens)  # as the config named them: read again from these
        self.tokens = self._configured
        self.grace = grace  # s a disconnected worker's lane waits for it to come back
        self.workers: dict[str, Worker] = {}
        self._lock = asyncio.Lock()
        self._rereading: asyncio.Task[None] | None = None
        gateway.fleet.awaits_workers = bool(self.tokens)
        # Its workers' nodes for the other gateways of the store, and theirs for it.
        self.shared = SharedNodes(gateway.store, gateway.fleet, self._lanes)

    def start(self) -> None:
        self.shared.start()

    def _lanes(self) -> dict[str, ComfyUILane]:
        return {worker.lane.name: worker.lane for worker in self.workers.values()}

    # -- the route ---------------------------------------------------------------

    async def connect(self, request: web.Request) -> web.StreamResponse:
        presented = _bearer(request)
        token = holder(self.tokens, presented) if presented else None
        if token is None:
            return _refusal(401, "unauthorized", "a worker token is required")
        # Not compressed: the streams carry PNGs and other packed bytes, and an
        # uncompressed frame is written whole at once, whichever stream sends it.
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT, max_msg_size=MAX_MESSAGE, compress=False)
        await ws.prepare(request)
        if self._rereading is None and any(t.file for t in self.tokens):
            self._rereading = asyncio.create_task(self._reread_tokens(), name="worker-tokens")
        try:
            hello = await _hello(ws)
            worker = await self._arrive(token, hello, ws, request.remote or "")
        except (TunnelBroken, TimeoutError, ValueError) as exc:
            await ws.close(code=4400, message=str(exc)[:120].encode())
            return ws
        log.info("worker %s connected (%d slots)", worker.name, worker.lane.spec.slots)
        welcome = {
            "type": "welcome",
            "lane": worker.lane.name,
            "tunnel": PROTOCOL,
            "gateway": self.gw.store.owner,  # to tell a hop to another gateway
        }
        await ws.send_str(json.dumps(welcome))
        mux = worker.end.attach(ws)
        ending = Ending.BROKEN
        try:
            ending = await carry(ws, mux, lambda message: self._control(worker, message))
        finally:
            await self._left(worker, ws, ending)
        return ws

    async def _arrive(
        self, token: WorkerToken, hello: dict[str, Any], ws: WebSocketLike, address: str
    ) -> Worker:
        if hello.get("tunnel") != PROTOCOL:
            raise ValueError(
                f"this gateway speaks tunnel protocol {PROTOCOL}, the worker another: "
                "run the same comfyfleet version on both"
            )
        own = hello.get("name") or ""
        if own and (not isinstance(own, str) or not NAME.fullmatch(own)):
            raise ValueError("a worker's name: 1 to 64 letters, digits, '.', '_' or '-'")
        slots = hello.get("slots", 1)
        if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be a whole number from 1 to {MAX_SLOTS}")
        name = f"{PREFIX}{token.name}" + (f".{own}" if own else "")
        async with self._lock:
            worker = self.workers.get(name)
            if worker is not None and worker.ws is not None and not worker.ws.closed:
                raise ValueError(f"a worker named {name} is connected already")
            if worker is not None and worker.lane.spec.slots != slots:
                await self._remove(worker)  # back with other slots: a new lane
                worker = None
            if worker is None:
                worker = await self._new(name, slots, token)
            worker.token = token
            if worker.leaving is not None:
                worker.leaving.cancel()
                worker.leaving = None
            worker.ws = ws
            now = time.time()
            machine = worker.link.machine  # known until read again on this connection
            worker.link = worker.lane.worker = WorkerLink(address, now, now, machine=machine)
            worker.machine_at = -math.inf
            worker.lane.draining = False  # the lane's flag: the scheduler reads it too
            worker.lane.state.released_by = math.inf  # back: what it runs is followed
        return worker

    async def _new(self, name: str, slots: int, token: WorkerToken) -> Worker:
        if name in self.gw.fleet.backends:
            raise ValueError(f"a backend named {name} exists")
        end = GatewayEnd()
        await end.start()
        lane = self.gw.fleet.backend_lane(BackendSpec(url=end.url, name=name, slots=slots))
        lane.only_tenant = token.tenant
        rebuild = lane.on_change

        async def changed() -> None:  # its nodes: in this gateway's union, and shared
            await rebuild()
            self.shared.poke()

        lane.on_change = changed
        self.gw.owners.pin(name)
        await self.gw.scheduler.add_lane(lane)
        link = WorkerLink("", time.time(), time.time())
        worker = Worker(name, end, lane, token, link)
        self.workers[name] = worker
        return worker

    async def _control(self, worker: Worker, message: dict[str, Any]) -> None:
        worker.link.seen_at = time.time()
        stale = time.monotonic() - worker.machine_at > MACHINE_EVERY
        if (worker.link.machine is None or stale) and not _busy(worker.reading):
            worker.reading = asyncio.create_task(
                self._read_machine(worker), name=f"machine-{worker.name}"
            )
        if message["type"] == "drain":
            worker.lane.draining = True
            worker.link.state = "draining"
            self.gw.scheduler.wake()  # what was set aside for it goes elsewhere
            if worker.telling is None or worker.telling.done():
                worker.telling = asyncio.create_task(
                    self._tell_drained(worker), name=f"drain-{worker.name}"
                )

    async def _read_machine(self, worker: Worker) -> None:
        """Its devices and memory, from its backend (at a beat: at join, then a minute
        apart); tried again at the next beat when the backend does not answer."""
        try:
            stats = await worker.lane.fetch_json("/system_stats", timeout=10.0)
        except BackendError:
            return
        worker.link.machine = machine_of(stats)
        worker.machine_at = time.monotonic()

    async def _tell_drained(self, worker: Worker) -> None:
        ws = worker.ws
        while ws is not None and not ws.closed and worker.lane.draining:
            if not self.gw.scheduler.runs_on(worker.lane.name):
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_str(json.dumps({"type": "drained"}))
                return
            await asyncio.sleep(0.1)

    async def _left(self, worker: Worker, ws: WebSocketLike, ending: Ending) -> None:
        async with self._lock:
            if worker.ws is not ws:
                return  # it came back on another connection meanwhile
            worker.ws = None
            worker.link.state = "away"
            log.info("worker %s disconnected (%s)", worker.name, ending.value)
            if worker.lane.draining:  # it said so: nothing to wait for
                # It stops what it still runs before it leaves (comfyfleet.workers.agent):
                # what its backend held goes back to the queue now, not after the hold.
                worker.lane.state.gone = True
                await self._remove(worker)
            else:
                if ending is Ending.BROKEN:  # died, or lets go unless back in time
                    deadline = time.monotonic() + RETURN_WINDOW + HOLD_MARGIN
                    worker.lane.state.released_by = deadline
                worker.leaving = asyncio.create_task(
                    self._remove_later(worker), name=f"leave-{worker.name}"
                )

    async def _remove_later(self, worker: Worker) -> None:
        await asyncio.sleep(self.grace)
        async with self._lock:
            if worker.ws is None and self.workers.get(worker.name) is worker:
                log.info("worker %s did not come back: its lane is removed", worker.name)
                await self._remove(worker)

    async def _remove(self, worker: Worker) -> None:
        """Its lane goes (what still runs there is re-queued at once: the worker is gone
        or has drained)."""
        self.workers.pop(worker.name, None)
        if worker.lane.name in {lane.name for lane in self.gw.scheduler.lanes}:
            await self.gw.scheduler.remove_lane(worker.lane.name, timeout=0)
        self.gw.owners.unpin(worker.name)
        await self.gw.fleet.forget(worker.name)
        await worker.end.close()
        self.shared.poke()

    async def _reread_tokens(self) -> None:
        """Token files are read again every heartbeat: a worker whose token was revoked
        (or replaced) is disconnected, and refused when it tries again."""
        while True:
            await asyncio.sleep(HEARTBEAT)
            self.tokens = await asyncio.to_thread(reread, self._configured)
            for worker in list(self.workers.values()):
                if worker.token not in self.tokens and worker.ws is not None:
                    log.warning("worker %s: its token was revoked", worker.name)
                    await worker.ws.close(code=4401, message=b"token revoked")

    async def close(self) -> None:
        """The gateway stops: every tunnel ends (its lanes stopped with the scheduler)."""
        if self._rereading is not None:
            self._rereading.cancel()
        await self.shared.close()
        for worker in list(self.workers.values()):
            for task in (worker.leaving, worker.telling, worker.reading):
                if task is not None:
                    task.cancel()
            if worker.ws is not None:
                await worker.ws.close()
            await worker.end.close()
        self.workers.clear()

    def status(self) -> list[dict[str, Any]]:
        """For /api/fleet/workers."""
        return [
            {
                "name": w.name,
                "lane": w.lane.name,
                "slots": w.lane.spec.slots,
                "tenant": w.lane.only_tenant,
                **link_json(w.link),
                "node_classes": len(w.lane.capabilities.object_info),
                "running": self.gw.scheduler.runs_on(w.lane.name),
            }
            for w in self.workers.values()
        ]


def link_json(link: WorkerLink) -> dict[str, Any]:
    """A worker's connection as the admin API and the dashboard show it."""
    return {
        "state": link.state,
        "address": link.address,
        "connected_at": link.connected_at,
        "seen_at": link.seen_at,
        "machine": link.machine,
    }


def _busy(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _bearer(request: web.Request) -> str | None:
    """The Authorization header's token: a worker sends no cookie and no query token."""
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def worker_routes(hub: WorkerHub) -> list[Route]:
    async def list_workers(_request: web.Request) -> web.Response:
        return web.json_response({"workers": hub.status()})

    return [
        # Public to the client tokens' check: it takes worker tokens, and only them.
        Route("GET", "/api/workers/connect", hub.connect, api_alias=False, public=True),
        Route("GET", "/api/fleet/workers", list_workers, admin=True),
    ]


async def _hello(ws: web.WebSocketResponse) -> dict[str, Any]:
    async with asyncio.timeout(HELLO_TIMEOUT):
        message = await ws.receive()
    if message.type != WSMsgType.TEXT:
        raise TunnelBroken("the first message must be the worker's hello")
    hello = control_of(message.data)
    if hello["type"] != "hello":
        raise TunnelBroken("the first message must be the worker's hello")
    return hello


def _refusal(status: int, type_: str, message: str) -> web.Response:
    """As the client routes refuse (ComfyUI's error shape), naming the worker realm."""
    headers = {"WWW-Authenticate": 'Bearer realm="comfyfleet workers"'}
    return web.json_response(
        prompt_error_body(error(type_, message)), status=status, headers=headers
    )
