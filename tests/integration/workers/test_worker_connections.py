"""What a gateway takes on its workers' route, and from whom: worker tokens only, a
hello first, and only what the tunnel's protocol allows (anything else ends the
connection). A worker token opens nothing a client token opens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.server.config import AuthToken
from comfyfleet.server.workers.hub import HEARTBEAT
from comfyfleet.tunnel.ends import PROTOCOL
from comfyfleet.tunnel.mux import CHUNK, CREDIT, DATA, OPEN, frame
from comfyfleet.workers.tokens import WorkerToken
from tests.servers import start_in_process

WORKER = "worker-token-5e8a1c0f93b2d7"
CLIENT = "client-token-0a9f8e7d6c5b"
HELLO = json.dumps({"type": "hello", "name": "w1", "slots": 1, "tunnel": PROTOCOL})


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[str]:
    server, _gw = await start_in_process(
        tmp_path / "data",
        local_slots=0,
        auth_tokens=(AuthToken(CLIENT, "default", admin=True),),
        worker_tokens=(WorkerToken("pool", WORKER),),
    )
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_only_a_worker_token_connects_and_it_opens_nothing_else(gateway: str) -> None:
    async with aiohttp.ClientSession() as session:
        for headers in ({}, bearer(CLIENT), bearer(WORKER + "x")):
            async with session.get(f"{gateway}/api/workers/connect", headers=headers) as answer:
                assert answer.status == 401
        # The cookie or query a browser would carry is not a worker's either.
        async with session.get(f"{gateway}/api/workers/connect?token={WORKER}") as answer:
            assert answer.status == 401
        for method, path in (
            ("POST", "/prompt"),
            ("GET", "/history"),
            ("GET", "/queue"),
            ("GET", "/ws"),
            ("GET", "/api/fleet/workers"),
        ):
            async with session.request(method, gateway + path, headers=bearer(WORKER)) as answer:
                assert answer.status == 401, path
        async with session.get(f"{gateway}/api/fleet/workers", headers=bearer(CLIENT)) as answer:
            assert (await answer.json()) == {"workers": []}


async def connected(
    session: aiohttp.ClientSession, gateway: str
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(f"{gateway}/api/workers/connect", headers=bearer(WORKER))
    await ws.send_str(HELLO)
    welcome = await ws.receive(timeout=10)
    lane = "backend:worker-pool.w1"
    said = json.loads(welcome.data)
    gateway_id = said.pop("gateway")  # which gateway took it
    assert said == {"type": "welcome", "lane": lane, "tunnel": PROTOCOL}
    assert isinstance(gateway_id, str) and gateway_id
    return ws


async def ends(ws: aiohttp.ClientWebSocketResponse) -> None:
    async with asyncio.timeout(10):
        while not ws.closed:
            message = await ws.receive()
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                break


@pytest.mark.parametrize(
    "sent",
    [
        frame(OPEN, 7),  # only the gateway opens streams
        frame(9, 1),  # no such kind
        b"\x02",  # shorter than a header
        frame(DATA, 1, b"x" * (CHUNK + 1)),  # past the message size
        frame(CREDIT, 1, b"\x00\x01"),  # a count is 4 bytes
        "not json",
        json.dumps({"no": "type"}),
    ],
)
async def test_what_the_protocol_does_not_allow_ends_the_connection(
    gateway: str, sent: bytes | str
) -> None:
    async with aiohttp.ClientSession() as session:
        ws = await connected(session, gateway)
        await (ws.send_bytes(sent) if isinstance(sent, bytes) else ws.send_str(sent))
        await ends(ws)
        assert ws.closed
        # It may come back, on a new connection.
        again = await connected(session, gateway)
        await again.close()


@pytest.mark.parametrize(
    ("hello", "why"),
    [
        ({"type": "hello", "name": "../x", "slots": 1, "tunnel": PROTOCOL}, "name"),
        ({"type": "hello", "slots": 0, "tunnel": PROTOCOL}, "slots"),
        ({"type": "hello", "slots": True, "tunnel": PROTOCOL}, "slots"),
        ({"type": "drain"}, "hello"),
        # A worker of another version: told why, in the close frame.
        ({"type": "hello", "name": "w1", "slots": 1}, "tunnel protocol"),
        ({"type": "hello", "name": "w1", "slots": 1, "tunnel": PROTOCOL + 1}, "tunnel protocol"),
    ],
)
async def test_a_bad_hello_is_refused(gateway: str, hello: dict[str, Any], why: str) -> None:
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"{gateway}/api/workers/connect", headers=bearer(WORKER))
        await ws.send_str(json.dumps(hello))
        message = await ws.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 4400
        assert why in (message.extra or "")
        async with session.get(f"{gateway}/api/fleet/workers", headers=bearer(CLIENT)) as answer:
            assert (await answer.json()) == {"workers": []}


async def test_a_second_worker_under_a_connected_name_is_refused(gateway: str) -> None:
    async with aiohttp.ClientSession() as session:
        first = await connected(session, gateway)
        second = await session.ws_connect(f"{gateway}/api/workers/connect", headers=bearer(WORKER))
        await second.send_str(HELLO)
        message = await second.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 4400
        async with session.get(f"{gateway}/api/fleet/workers", headers=bearer(CLIENT)) as answer:
            [listed] = (await answer.json())["workers"]
        assert listed["name"] == "worker-pool.w1" and listed["state"] == "connected"
        # Its lane is not removed as a backend would be: the worker leaves by itself.
        url = f"{gateway}/api/fleet/backends/worker-pool.w1"
        async with session.delete(url, headers=bearer(CLIENT)) as refused:
            assert refused.status == 409
            assert (await refused.json())["error"]["type"] == "worker_lane"
        await first.close()


async def test_a_token_whose_file_is_emptied_is_revoked_within_a_heartbeat(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "worker-token.txt"
    secret.write_text(WORKER + "\n")
    server, _gw = await start_in_process(
        tmp_path / "data",
        local_slots=0,
        worker_tokens=(WorkerToken("pool", WORKER, secret),),
    )
    gateway = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as session:
            ws = await connected(session, gateway)
            secret.write_text("")  # revoked: no restart
            started = asyncio.get_running_loop().time()
            async with asyncio.timeout(HEARTBEAT + 5):
                message = await ws.receive()
                while message.type == aiohttp.WSMsgType.BINARY:  # its lane asks its backend
                    message = await ws.receive()
            assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 4401
            assert asyncio.get_running_loop().time() - started <= HEARTBEAT + 1
            url = f"{gateway}/api/workers/connect"
            async with session.get(url, headers=bearer(WORKER)) as again:
                assert again.status == 401
            # Another token in the file: that one connects, the old one stays out.
            secret.write_text("rotated-token-8a7b6c5d4e3f\n")
            await asyncio.sleep(HEARTBEAT + 0.5)
            async with session.get(url, headers=bearer(WORKER)) as old:
                assert old.status == 401
            rotated = await session.ws_connect(url, headers=bearer("rotated-token-8a7b6c5d4e3f"))
            await rotated.send_str(HELLO)
            assert json.loads((await rotated.receive(timeout=10)).data)["type"] == "welcome"
            await rotated.close()
    finally:
        await server.close()
