"""The tunnel's streams over a real WebSocket on loopback, between a gateway's end and a
worker's end leading to a real TCP server: one stream whose reader stops reading holds
back only itself, within its window, and the rest flow on; a peer that sends past a
stream's window or credit ends the tunnel."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from comfyfleet.tunnel.ends import GatewayEnd, carry, worker_mux
from comfyfleet.tunnel.mux import (
    CHUNK,
    COUNT,
    CREDIT,
    DATA,
    MAX_MESSAGE,
    WINDOW,
    Mux,
    TunnelBroken,
    frame,
)

BIG = os.urandom(64 * WINDOW)  # past the sockets' buffers on the way, many windows over


async def ignore(_message: dict[str, Any]) -> None:
    return None


@dataclass
class Backend:
    """A TCP server: `BIG\\n` is answered with BIG (its writes counted), any other line
    is echoed."""

    port: int = 0
    big_written: int = 0  # bytes of BIG its socket took so far

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if line == b"BIG\n":
                    for at in range(0, len(BIG), CHUNK):
                        writer.write(BIG[at : at + CHUNK])
                        await writer.drain()
                        self.big_written = at + CHUNK
                else:
                    writer.write(line)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest.fixture
async def tunnel() -> AsyncIterator[tuple[GatewayEnd, Backend]]:
    backend = Backend()
    server = await asyncio.start_server(backend.serve, "127.0.0.1", 0)
    backend.port = server.sockets[0].getsockname()[1]

    async def worker_side(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
        await ws.prepare(request)
        await carry(ws, worker_mux(ws, "127.0.0.1", backend.port), ignore)
        return ws

    app = web.Application()
    app.router.add_get("/tunnel", worker_side)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    end = GatewayEnd()
    await end.start()
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"http://127.0.0.1:{port}/tunnel", max_msg_size=MAX_MESSAGE)
        carrying = asyncio.create_task(carry(ws, end.attach(ws), ignore))
        try:
            yield end, backend
        finally:
            await end.close()
            await ws.close()
            await carrying
            await runner.cleanup()
            server.close()
            await server.wait_closed()


async def test_a_reader_that_stops_holds_back_its_own_stream_only(
    tunnel: tuple[GatewayEnd, Backend],
) -> None:
    end, backend = tunnel
    # A client that asks for a large body and does not read it (a slow download).
    slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", end.port)
    slow_writer.write(b"BIG\n")
    await slow_writer.drain()
    await asyncio.sleep(1.0)  # the tunnel fills what it may of that stream
    # Another stream on the same tunnel answers at once.
    reader, writer = await asyncio.open_connection("127.0.0.1", end.port)
    async with asyncio.timeout(2):
        for n in range(20):
            writer.write(f"ping {n}\n".encode())
            assert await reader.readline() == f"ping {n}\n".encode()
    writer.close()
    # The stalled stream waits in the kernel's socket buffers and, in the tunnel, its
    # window at most: the body is not read into memory.
    assert end.mux is not None and 0 < end.mux.unwritten <= WINDOW
    assert backend.big_written < len(BIG)
    # Read at last, the whole body comes through, in order, credit after credit.
    async with asyncio.timeout(30):
        body = await slow_reader.readexactly(len(BIG))
    assert hashlib.sha256(body).digest() == hashlib.sha256(BIG).digest()
    slow_writer.close()


async def one_stream(sent: list[bytes]) -> tuple[Mux, int, asyncio.StreamWriter]:
    """A gateway's end with one stream open to a local client that reads nothing; its
    frames go to `sent`."""

    async def send(message: bytes) -> None:
        sent.append(message)

    mux = Mux(send)
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    client = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    await mux.open(*await accepted.get())
    server.close()
    return mux, 1, client[1]


async def test_bytes_past_a_streams_window_end_the_tunnel() -> None:
    sent: list[bytes] = []
    mux, stream, client = await one_stream(sent)
    chunk = frame(DATA, stream, b"x" * CHUNK)
    for _ in range(WINDOW // CHUNK):  # a whole window, unread: allowed
        await mux.feed(chunk)
    with pytest.raises(TunnelBroken, match="past the window"):
        await mux.feed(frame(DATA, stream, b"x"))
    await mux.close()
    client.close()


async def test_credit_past_a_streams_window_ends_the_tunnel() -> None:
    sent: list[bytes] = []
    mux, stream, client = await one_stream(sent)
    await mux.feed(frame(CREDIT, stream, COUNT.pack(0)))  # nothing sent yet: no room
    with pytest.raises(TunnelBroken, match="credit past the window"):
        await mux.feed(frame(CREDIT, stream, COUNT.pack(1)))
    await mux.close()
    client.close()
