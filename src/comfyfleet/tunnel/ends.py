"""The two ends of a tunnel over an aiohttp WebSocket (either the server's or the
client's kind): `GatewayEnd` listens on a loopback port for the worker's lane,
`worker_end` connects the streams to the worker's backend."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from comfyfleet.tunnel.mux import Mux, TunnelBroken

log = logging.getLogger(__name__)

#: Control messages (JSON text) are small: anything longer ends the tunnel.
MAX_CONTROL = 16 * 1024
#: The tunnel's protocol, said in the worker's hello and the gateway's welcome: 2 has
#: per-stream credit (mux.CREDIT). Both ends speak the same one, or part.
PROTOCOL = 2
#: A worker whose connection broke (Ending.BROKEN) and is not welcomed back within this
#: many seconds lets go of what its backend runs for the gateway, which then runs it
#: elsewhere (s).
RETURN_WINDOW = 1.0

OnControl = Callable[[dict[str, Any]], Awaitable[None]]


class WebSocketLike(Protocol):
    @property
    def closed(self) -> bool: ...

    async def send_bytes(self, data: bytes) -> None: ...
    async def send_str(self, data: str) -> None: ...
    async def close(self, *, code: int = ..., message: bytes = ...) -> bool: ...
    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage: ...
    def exception(self) -> BaseException | None: ...


class Ending(enum.Enum):
    """How a tunnel's connection ended, which tells what the other end knows."""

    CLOSED = "closed"  # a close frame: ended on purpose, by one end or the other
    # Dropped without one: the other process died (its kernel closed the connection),
    # or something between reset it, and then the other end sees the same at once.
    BROKEN = "broken"
    # No answer to a ping within the heartbeat: the other end or the path is silent,
    # and the other end may not know yet.
    SILENT = "silent"
    REFUSED = "refused"  # the other end broke the protocol (TunnelBroken)


async def carry(ws: WebSocketLike, mux: Mux, on_control: OnControl) -> Ending:
    """Read the WebSocket until it closes: binary messages are the streams', text ones
    the control messages (JSON objects). Every stream ends with it."""
    ending = Ending.BROKEN
    try:
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                await mux.feed(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT:
                await on_control(control_of(message.data))
            else:
                ending = _ending(message.type, ws.exception())
                break
    except TunnelBroken as exc:
        log.warning("tunnel ended: %s", exc)
        ending = Ending.REFUSED
    finally:
        await mux.close()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()
    return ending


def _ending(kind: aiohttp.WSMsgType, exc: BaseException | None) -> Ending:
    if kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING):
        return Ending.CLOSED
    if isinstance(exc, TimeoutError):  # aiohttp's heartbeat: no pong in time
        return Ending.SILENT
    return Ending.BROKEN


def control_of(text: str) -> dict[str, Any]:
    if len(text) > MAX_CONTROL:
        raise TunnelBroken("a control message past its size")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TunnelBroken("a control message that is not JSON") from exc
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise TunnelBroken("a control message without a type")
    return value


class GatewayEnd:
    """A loopback port whose connections go through the worker's tunnel while it is
    attached; with none attached they are closed at once (the backend is down)."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self.mux: Mux | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mux is None or self.mux.closed:
            writer.close()
            return
        try:
            await self.mux.open(reader, writer)
        except (ConnectionError, RuntimeError):
            writer.close()

    def attach(self, ws: WebSocketLike) -> Mux:
        self.mux = Mux(ws.send_bytes)
        return self.mux

    async def close(self) -> None:
        if self.mux is not None:
            await self.mux.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def worker_mux(ws: WebSocketLike, host: str, port: int) -> Mux:
    """The worker's end: each stream the gateway opens is a connection to its backend at
    host:port (loopback), and nowhere else."""

    async def connect(_stream: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5)
        except (OSError, TimeoutError) as exc:
            log.warning("the backend at %s:%s did not answer: %s", host, port, exc)
            return None

    return Mux(ws.send_bytes, connect)
