"""`comfyfleet worker`'s connection to its gateway: it connects out (the only
connection it makes to the gateway), says who it is, then carries the tunnel to its
backend until told to stop, reconnecting after a loss (0.5 s, doubling to 10 s).

Stopping (SIGTERM) drains: the gateway is told, gives the worker no new job, and says
`drained` once nothing of the worker's runs; after `grace` seconds the worker ends what
its backend still runs, then leaves, and the gateway re-queues what was left.

Cut off from the gateway, it stops what a backend that holds nothing for the gateway (a
ComfyUI) runs: the gateway has that run elsewhere at once.
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

from comfyfleet.domain.jobs import PACK_ROUTE, pack_features
from comfyfleet.tunnel.ends import carry, control_of, worker_mux
from comfyfleet.tunnel.mux import MAX_MESSAGE, TunnelBroken

log = logging.getLogger(__name__)

CONNECT_PATH = "/api/workers/connect"
HEARTBEAT = 5.0
FIRST_RETRY, LAST_RETRY = 0.5, 10.0


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
        self._joined = False  # welcomed on the current connection

    async def run(self) -> int:
        """Until `stopping` is set and the drain is over: 0, or 1 when refused."""
        wait = FIRST_RETRY
        headers = {"Authorization": f"Bearer {self.settings.token}"}
        # Bounds on the handshake alone (the WebSocket then lives as long as it is open):
        # a gateway behind a cut or a black hole is tried again, not waited on for minutes.
        handshake = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
        async with aiohttp.ClientSession(headers=headers, timeout=handshake) as session:
            while not self.stopping.is_set():
                try:
                    await self._connected(session)
                    wait = FIRST_RETRY
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status in (401, 403):
                        self.refused = f"the gateway refused the token ({exc.status})"
                        log.error("%s", self.refused)
                        return 1
                    log.warning("could not connect to %s: %s", self._url, exc)
                except (aiohttp.ClientError, OSError, TimeoutError, TunnelBroken) as exc:
                    log.warning("connection to %s lost or refused: %s", self._url, exc)
                if self.stopping.is_set():
                    break
                if self._joined:
                    self._joined = False
                    await self._cut_off()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
                wait = min(LAST_RETRY, wait * 2)
        return 0

    async def _connected(self, session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(
            self._url, heartbeat=HEARTBEAT, max_msg_size=MAX_MESSAGE
        ) as ws:
            hello = {"type": "hello", "name": self.settings.name, "slots": self.settings.slots}
            await ws.send_str(json.dumps(hello))
            welcome = await ws.receive(timeout=30)
            if welcome.type != aiohttp.WSMsgType.TEXT:
                raise TunnelBroken(f"no welcome: {welcome.data or welcome.extra or welcome.type}")
            log.info("joined the fleet as lane %s", control_of(welcome.data).get("lane"))
            self._joined = True
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
            await asyncio.gather(carrying, stop, beats, return_exceptions=True)

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

    async def _cut_off(self) -> None:
        """The gateway is out of reach. A backend that holds the gateway's prompts (the
        built-in engine) stops them itself once their hold runs out, and the gateway
        waits for that; any other (a ComfyUI) has them run elsewhere at once, so they
        are stopped here now rather than run in two places."""
        if not await self._backend_holds():
            log.warning("cut off from the gateway: the backend's prompts are stopped")
            await self._interrupt_backend()

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


async def _beat(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Its last word, every heartbeat: the gateway shows when it last heard from it."""
    while not ws.closed:
        await asyncio.sleep(HEARTBEAT)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps({"type": "beat"}))
