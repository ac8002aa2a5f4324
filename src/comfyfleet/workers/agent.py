"""`comfyfleet worker`'s connection to its gateway: it connects out (the only
connection it makes to the gateway), says who it is, then carries the tunnel to its
backend until told to stop, reconnecting after a loss (0.5 s, doubling to 10 s).

Stopping (SIGTERM) drains: the gateway is told, gives the worker no new job, and says
`drained` once nothing of the worker's runs; after `grace` seconds the worker ends what
its backend still runs, then leaves, and the gateway re-queues what was left.

Cut off from the gateway, it stops what a backend that holds nothing for the gateway (a
ComfyUI) runs: the gateway has that run elsewhere at once. When its connection broke
(Ending.BROKEN: the gateway sees the same, and takes it for a worker that died) and it
is not welcomed back by the same gateway within RETURN_WINDOW, a backend that holds the
gateway's prompts lets go of them (the gateway runs them elsewhere from then on);
unless every attempt to reconnect was refused (the gateway's process is down: nothing
runs them elsewhere before the hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from comfyfleet.domain.jobs import HOLDS_ROUTE, PACK_ROUTE, pack_features
from comfyfleet.protocol.prompt import queue_item_ids
from comfyfleet.tunnel.ends import (
    PROTOCOL,
    RETURN_WINDOW,
    Ending,
    carry,
    control_of,
    worker_mux,
)
from comfyfleet.tunnel.mux import MAX_MESSAGE, TunnelBroken

log = logging.getLogger(__name__)

CONNECT_PATH = "/api/workers/connect"
HEARTBEAT = 5.0  # s between WebSocket pings: no pong within half of it, it is silent
#: s between its beats: a path reset on the gateway's side only is noticed here at the
#: next one, well within RETURN_WINDOW.
BEAT = 0.5
FIRST_RETRY, LAST_RETRY = 0.5, 10.0
MAX_IDS = 10_000  # prompt ids released at once (the holds route's cap)


@dataclass
class WorkerSettings:
    gateway: str  # http(s)://host:port of any gateway
    token: str = field(repr=False)
    name: str  # "" for the token's name alone
    slots: int
    backend: str  # the backend's URL, e.g. http://127.0.0.1:8190
    grace: float = 30.0


def connect_url(gateway: str) -> str:
    parts = urlsplit(gateway)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the gateway's URL must be http(s)://host[:port], not {gateway!r}")
    return gateway.rstrip("/") + CONNECT_PATH


class WorkerAgent:
    def __init__(
        self, settings: WorkerSettings, cut_short: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.settings = settings
        # Ends what its backend still runs once the grace is over, before the gateway
        # hears it left (and queues that work again): run here too, it would run twice.
        # By default its queue is cleared and its prompt interrupted (ComfyUI's API).
        self._cut_short = cut_short or self._interrupt_backend
        backend = urlsplit(settings.backend)
        self._host = backend.hostname or "127.0.0.1"
        self._port = backend.port or (443 if backend.scheme == "https" else 80)
        self._url = connect_url(settings.gateway)
        self.stopping = asyncio.Event()
        self.refused: str | None = None  # why the gateway turned it away for good
        self._welcomed = asyncio.Event()  # on the current connection
        self._gateway = ""  # the id of the gateway that welcomed it last
        # Since the connection broke: None before an attempt failed, then whether every
        # failed attempt was refused.
        self._only_refused: bool | None = None
        self._letting_go: asyncio.Task[None] | None = None

    async def run(self) -> int:
        """Until `stopping` is set and the drain is over: 0, or 1 when refused."""
        wait = FIRST_RETRY
        headers = {"Authorization": f"Bearer {self.settings.token}"}
        # Bounds on the handshake alone (the WebSocket then lives as long as it is open):
        # a gateway behind a cut or a black hole is tried again, not waited on for minutes.
        handshake = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
        async with aiohttp.ClientSession(headers=headers, timeout=handshake) as session:
            try:
                while not self.stopping.is_set():
                    ending = Ending.BROKEN
                    try:
                        ending = await self._connected(session)
                        wait = FIRST_RETRY
                    except aiohttp.WSServerHandshakeError as exc:
                        if exc.status in (401, 403):
                            self.refused = f"the gateway refused the token ({exc.status})"
                            log.error("%s", self.refused)
                            return 1
                        log.warning("could not connect to %s: %s", self._url, exc)
                        self._only_refused = False  # an answer: the gateway runs
                    except (aiohttp.ClientError, OSError, TimeoutError, TunnelBroken) as exc:
                        log.warning("connection to %s lost or refused: %s", self._url, exc)
                        first = self._only_refused is None
                        self._only_refused = _refused(exc) and (first or self._only_refused)
                    if self.refused is not None:
                        return 1
                    if self.stopping.is_set():
                        break
                    if self._welcomed.is_set():
                        await self._lost(ending)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stopping.wait(), wait)
                    wait = min(LAST_RETRY, wait * 2)
            finally:
                if self._letting_go is not None:
                    await self._letting_go  # it lets go before it leaves
        return 0

    async def _lost(self, ending: Ending) -> None:
        """Its connection ended, not by its own stop. A backend that holds nothing for
        the gateway (a ComfyUI) has its work run elsewhere at once: it is stopped now.
        One that holds it (the built-in engine) goes on until its hold runs out, unless
        the connection broke (below)."""
        self._welcomed.clear()
        deadline = asyncio.get_running_loop().time() + RETURN_WINDOW  # as the gateway counts
        if not await self._backend_holds():
            log.warning("cut off from the gateway: the backend's prompts are stopped")
            await self._interrupt_backend()
        elif ending is Ending.BROKEN:
            self._only_refused = None
            if self._letting_go is None or self._letting_go.done():
                self._letting_go = asyncio.create_task(self._let_go_unless_back(deadline))

    async def _let_go_unless_back(self, deadline: float) -> None:
        """The gateway saw the break too: unless welcomed back by it by `deadline` (the
        loop's time), it runs what it sent here elsewhere, so it must not run here any
        more. Another gateway (behind the same address) does not follow it either."""
        left = self._gateway
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self._welcomed.wait()
        back = self._welcomed.is_set() and self._gateway == left
        if back or (self._only_refused and not self._welcomed.is_set()):
            return
        log.warning("the connection broke: the backend lets go of the gateway's prompts")
        await self._release_held()

    async def _connected(self, session: aiohttp.ClientSession) -> Ending:
        async with session.ws_connect(
            self._url, heartbeat=HEARTBEAT, max_msg_size=MAX_MESSAGE
        ) as ws:
            settings = self.settings
            hello = {"type": "hello", "name": settings.name, "slots": settings.slots}
            await ws.send_str(json.dumps({**hello, "tunnel": PROTOCOL}))
            answer = await ws.receive(timeout=30)
            if answer.type != aiohttp.WSMsgType.TEXT:
                raise TunnelBroken(f"no welcome: {answer.data or answer.extra or answer.type}")
            welcome = control_of(answer.data)
            if welcome.get("tunnel") != PROTOCOL:
                self.refused = (
                    f"the gateway speaks another tunnel protocol than {PROTOCOL}: "
                    "run the same comfyfleet version on both"
                )
                log.error("%s", self.refused)
                return Ending.CLOSED
            log.info("joined the fleet as lane %s", welcome.get("lane"))
            self._gateway = str(welcome.get("gateway", ""))
            self._welcomed.set()
            drained = asyncio.Event()

            async def on_control(message: dict[str, Any]) -> None:
                if message["type"] == "drained":
                    drained.set()

            mux = worker_mux(ws, self._host, self._port)
            carrying = asyncio.create_task(carry(ws, mux, on_control), name="tunnel")
            stop = asyncio.create_task(self.stopping.wait(), name="stop")
            beats = asyncio.create_task(_beat(ws), name="beats")
            await asyncio.wait([carrying, stop], return_when=asyncio.FIRST_COMPLETED)
            if stop.done() and not carrying.done():
                await self._drain(ws, drained, carrying)
            stop.cancel()
            beats.cancel()
            await asyncio.gather(stop, beats, return_exceptions=True)
            return await carrying

    async def _drain(
        self, ws: aiohttp.ClientWebSocketResponse, drained: asyncio.Event, carrying: Any
    ) -> None:
        log.info(
            "draining: no new job; waiting up to %g s for the running ones", self.settings.grace
        )
        await ws.send_str(json.dumps({"type": "drain"}))
        ended = asyncio.create_task(drained.wait())
        # Whichever comes first: drained, the connection lost, or the grace over.
        await asyncio.wait(
            [ended, carrying], timeout=self.settings.grace, return_when=asyncio.FIRST_COMPLETED
        )
        ended.cancel()
        if not drained.is_set() and not carrying.done():
            log.warning("the grace ran out: what still runs goes back to the gateway's queue")
            await self._cut_short()
        await ws.close()

    async def _backend_holds(self) -> bool:
        url = self.settings.backend.rstrip("/") + PACK_ROUTE
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                session.get(url) as answer,
            ):
                pack = await answer.json() if answer.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return False
        return pack_features(pack)[1]

    async def _release_held(self) -> None:
        """A comfyfleet backend lets go of the gateway's prompts it holds: those that run
        are given back to its queue at once, to wait for a keep (scheduler/holds.py)."""
        base = self.settings.backend.rstrip("/")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            try:
                async with session.get(base + "/queue") as answer:
                    queue = await answer.json()
                ids = _queued_ids(queue)
                async with session.post(base + HOLDS_ROUTE, json={"release": ids}) as answer:
                    answer.raise_for_status()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                log.warning("could not release the backend's prompts: %s", exc)

    async def _interrupt_backend(self) -> None:
        base = self.settings.backend.rstrip("/")
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for path, body in (("/queue", {"clear": True}), ("/interrupt", {})):
                try:
                    async with session.post(base + path, json=body) as answer:
                        answer.raise_for_status()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.warning("could not stop the backend's work (%s): %s", path, exc)


def _refused(exc: BaseException) -> bool:
    """Whether nothing listens at the gateway's address (its process is down)."""
    return isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, ConnectionRefusedError
    )


def _queued_ids(queue: Any) -> list[str]:
    """The prompt ids of a `GET /queue` answer (running and pending)."""
    if not isinstance(queue, dict):
        raise ValueError("a queue that is not a JSON object")
    ids = queue_item_ids(queue.get("queue_running")) + queue_item_ids(queue.get("queue_pending"))
    return ids[:MAX_IDS]


async def _beat(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Its last word, every BEAT: the gateway shows when it last heard from it, and a
    reset on the gateway's side of the path shows here as a failed send."""
    while not ws.closed:
        await asyncio.sleep(BEAT)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps({"type": "beat"}))
