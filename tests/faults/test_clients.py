"""Slow and vanishing websocket clients against an in-process server.

A client that never reads must not slow the others (each socket has its own bounded
queue) nor grow the server's memory without bound (past MAX_BACKLOG queued frames its
connection is dropped); a thousand clients coming and going leave the hub empty.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from comfyfleet.server.delivery.hub import MAX_BACKLOG
from tests.integration.gateway.wire import Served, poll, save_prompt, serve

pytestmark = pytest.mark.faults

CLIENTS = 1000
BATCH = 100


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def stuck_client(served: Served, client_id: str) -> asyncio.StreamWriter:
    """A websocket client that completes the handshake and then never reads again
    (tiny receive buffer, so the server's side backs up at once)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.server.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return writer  # from here on nothing reads `reader`


async def test_a_client_that_never_reads_slows_nobody_and_is_dropped(tmp_path: Path) -> None:
    async with serve(tmp_path / "data") as served:
        hub = served.gateway.hub
        slow_id = "never-reads-" + uuid.uuid4().hex
        stuck = await stuck_client(served, slow_id)
        await poll(lambda: asyncio.sleep(0, hub.connected(slow_id)), what="the slow client")
        fast = await served.connect()

        payload = {"blob": "x" * 2000}
        sent = 0
        rss_before = rss_bytes()

        async def stuff() -> None:
            # Far more than the bound: 40 x MAX_BACKLOG frames of 2 kB (~800 MB if kept).
            nonlocal sent
            for _ in range(40):
                for _ in range(MAX_BACKLOG):
                    hub.send_json(slow_id, "spam", payload)
                sent += MAX_BACKLOG
                await asyncio.sleep(0.01)

        stuffing = asyncio.create_task(stuff())
        latencies = []
        for n in range(15):
            started = time.monotonic()
            prompt_id = await served.submit(save_prompt(n, f"fast{n}"), fast.client_id)
            await fast.done(prompt_id, timeout=10)
            latencies.append(time.monotonic() - started)
        await stuffing
        rss_growth = rss_bytes() - rss_before

        # Dropped, not kept: the hub let it go, and its frames were not all held.
        await poll(
            lambda: asyncio.sleep(0, not hub.connected(slow_id)),
            what="the stuck client to be dropped",
            timeout=10,
        )
        assert sent == 40 * MAX_BACKLOG
        assert hub.dropped == 1  # counted (comfyfleet_websocket_dropped_total)
        assert rss_growth < 300 * 2**20, rss_growth
        # The others never waited on it: every done signal came promptly.
        assert max(latencies) < 2.0, latencies
        assert hub.connected(fast.client_id)
        prompt_id = await served.submit(save_prompt(99, "after"), fast.client_id)
        await fast.done(prompt_id, timeout=10)
        stuck.close()


async def test_a_thousand_clients_come_and_go_and_the_hub_ends_empty(tmp_path: Path) -> None:
    """In batches: half leave with a close handshake, half just vanish (connection reset)."""
    async with serve(tmp_path / "data") as served:
        hub = served.gateway.hub
        for start in range(0, CLIENTS, BATCH):
            sockets = await asyncio.gather(*(served.connect() for _ in range(BATCH)))
            assert hub.count() >= BATCH
            for n, sock in enumerate(sockets):
                if n % 2:
                    transport = sock.ws._response.connection.transport  # type: ignore[union-attr]
                    assert transport is not None
                    transport.abort()  # vanish: no close frame
            await asyncio.gather(*(sock.close() for sock in sockets))
            served.sockets.clear()
            assert start + BATCH <= CLIENTS

        await poll(lambda: asyncio.sleep(0, hub.count() == 0), what="an empty hub", timeout=20)
        # Still serving: a new client runs a prompt and gets its done signal.
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(1, "alive"), sock.client_id)
        await sock.done(prompt_id, timeout=10)
        assert hub.count() == 1
