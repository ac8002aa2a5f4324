"""A worker facing a gateway of another tunnel protocol (an older comfyfleet) does not
carry streams it cannot read: it says why and stops (exit 1), rather than reconnect
forever. The gateway here is a real WebSocket server on loopback that welcomes as an
older gateway did."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from comfyfleet.tunnel.ends import PROTOCOL
from comfyfleet.workers.agent import CONNECT_PATH, WorkerAgent, WorkerSettings


@pytest.fixture
async def older_gateway() -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    hellos: list[dict[str, object]] = []

    async def connect(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hellos.append(json.loads((await ws.receive(timeout=10)).data))
        await ws.send_str(json.dumps({"type": "welcome", "lane": "backend:worker-pool.w1"}))
        await ws.receive(timeout=10)  # the worker leaves
        return ws

    app = web.Application()
    app.router.add_get(CONNECT_PATH, connect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", hellos
    finally:
        await runner.cleanup()


async def test_a_worker_stops_at_a_gateway_of_another_tunnel_protocol(
    older_gateway: tuple[str, list[dict[str, object]]],
) -> None:
    url, hellos = older_gateway
    settings = WorkerSettings(
        gateway=url, token="t" * 24, name="w1", slots=1, backend="http://127.0.0.1:9"
    )
    agent = WorkerAgent(settings)
    assert await agent.run() == 1
    assert agent.refused is not None and "tunnel protocol" in agent.refused
    assert hellos == [{"type": "hello", "name": "w1", "slots": 1, "tunnel": PROTOCOL}]
