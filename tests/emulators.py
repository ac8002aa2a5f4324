"""The provider emulator on 127.0.0.1, for tests that need a paid-API stand-in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from comfyfleet.testing.emulators.app import build_emulator_app, emulator_state
from comfyfleet.testing.emulators.state import EmulatorSettings, EmulatorState


@dataclass
class Emulator:
    server: TestServer
    settings: EmulatorSettings
    state: EmulatorState

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def stats(self) -> dict[str, Any]:
        """The counters, read in process."""
        return self.state.stats()

    async def fetch_stats(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """The counters, read over HTTP as a test client would (`/_emulator/stats`)."""
        async with session.get(f"{self.url}/_emulator/stats") as response:
            body: dict[str, Any] = await response.json()
            return body


async def start_emulator(key: str, **settings: Any) -> Emulator:
    """An emulator accepting `key`, with deterministic jobs unless `settings` say otherwise."""
    chosen = {"latency": 0.3, "jitter": 0.0, "keys": [key], "seed": 1, **settings}
    dials = EmulatorSettings(**chosen)
    app = build_emulator_app(dials)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return Emulator(server, dials, emulator_state(app))
