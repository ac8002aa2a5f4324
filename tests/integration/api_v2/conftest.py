"""Comfy API v2 tests: a real gateway on loopback, driven by Comfy's own SDK (comfy-sdk)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from comfy_sdk import AsyncComfy

from comfyfleet.server.config import AuthToken
from comfyfleet.server.gateway import Gateway
from tests.servers import start_in_process

ALICE = "alice-v2-token-5c1e9a"
BOB = "bob-v2-token-8d2f0b"
TOKENS = (AuthToken(ALICE, "alice"), AuthToken(BOB, "bob"))


def image_workflow(prefix: str = "v2", color: int = 0x3366AA) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 16, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def slow_workflow(seconds: float = 60.0) -> dict[str, Any]:
    """An image saved after `seconds` of an interruptible sleep."""
    flow = image_workflow("slow")
    flow["3"] = {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}}
    flow["2"]["inputs"]["images"] = ["3", 0]
    return flow


@dataclass
class Served:
    server: TestServer
    gateway: Gateway
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def call(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> tuple[int, Any, Any]:
        """(status, headers, JSON body or None) of one request."""
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with self.session.request(
            method, self.url + path, headers=headers, **kwargs
        ) as reply:
            raw = await reply.read()
            try:
                body = await reply.json(content_type=None) if raw else None
            except ValueError:
                body = None
            return reply.status, reply.headers, body

    def client(self, monkeypatch: pytest.MonkeyPatch, token: str | None = None) -> AsyncComfy:
        """The SDK pointed at this gateway (COMFY_BASE_URL), as the tenant of `token`."""
        monkeypatch.setenv("COMFY_BASE_URL", self.url)
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        return AsyncComfy(api_key=token, timeout=30.0)


async def serve(tmp_path: Path, **settings: Any) -> AsyncIterator[Served]:
    server, gateway = await start_in_process(tmp_path / "data", **settings)
    session = aiohttp.ClientSession()
    try:
        yield Served(server, gateway, session)
    finally:
        await session.close()
        await server.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """A gateway with one slot (a second job waits in the queue), auth off."""
    async for one in serve(tmp_path, local_slots=1):
        yield one


@pytest.fixture
async def tenants(tmp_path: Path) -> AsyncIterator[Served]:
    """A gateway with authentication on: tokens ALICE and BOB, each its own tenant."""
    async for one in serve(tmp_path, local_slots=2, auth_tokens=TOKENS):
        yield one
