"""The provider emulator on 127.0.0.1, and a client session to talk to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.emulators import Emulator, start_emulator

# Distinctive, so a leak is easy to spot in any message or log line.
KEY = "planted-KEY-5f0c2b9e7d41a8c3"


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    started = await start_emulator(KEY, latency=0.05)
    try:
        yield started
    finally:
        await started.server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session
