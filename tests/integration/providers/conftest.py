"""The provider emulator on 127.0.0.1, and a client session to talk to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from comfyfleet.providers.emulator import build_emulator_app, emulator_state
from comfyfleet.providers.emulator_state import EmulatorSettings, EmulatorState

# Distinctive, so a leak is easy to spot in any message or log line.
KEY = "planted-KEY-5f0c2b9e7d41a8c3"


@dataclass
class Emulator:
    server: TestServer
    settings: EmulatorSettings
    state: EmulatorState

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(f"{self.url}/_emulator/stats") as response:
            body: dict[str, Any] = await response.json()
            return body


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    settings = EmulatorSettings(latency=0.05, jitter=0.0, keys=[KEY], seed=1)
    app = build_emulator_app(settings)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Emulator(server, settings, emulator_state(app))
    finally:
        await server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session
