"""Fan-out against the provider emulator on 127.0.0.1: engines, services and graphs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.fanout import FanoutService, FanoutSettings, SecretVault
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.providers import DRIVERS
from comfyfleet.store.sqlite import SQLiteStore
from tests import emulators
from tests.emulators import Emulator

# Distinctive, so a leak is easy to spot anywhere.
KEY = "planted-FANOUT-KEY-7c1e93b0a5d2"
KEY_ENV = "FANOUT_TEST_KEY"
WRONG_ENV = "FANOUT_WRONG_KEY"
COLLECT = "Concurrent Collect Images (30)"
SUBMIT_FLUX = "Concurrent Submit | BFLFluxImage"


async def start_emulator(**settings: Any) -> Emulator:
    return await emulators.start_emulator(KEY, **settings)


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    started = await start_emulator()
    yield started
    await started.server.close()


@pytest.fixture(scope="session")
def nodes() -> NodeRegistry:
    return build_registry(testing=True)


@dataclass
class Rig:
    """An engine with the fan-out service on a real SQLite journal."""

    engine: Engine
    service: FanoutService
    store: SQLiteStore
    env: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    async def close(self) -> None:
        """What a process ending does (a restart is a second rig on the same file)."""
        if not self.closed:
            self.closed = True
            await self.service.close()
            self.engine.close()
            await self.store.close()


MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(tmp_path: Path, nodes: NodeRegistry) -> AsyncIterator[MakeRig]:
    made: list[Rig] = []

    async def make(
        settings: FanoutSettings | None = None, registry: NodeRegistry | None = None
    ) -> Rig:
        store = SQLiteStore(tmp_path / "journal.db", synchronous="NORMAL")
        await store.open()
        env = {KEY_ENV: KEY, WRONG_ENV: "not-the-key"}
        service = FanoutService(store, SecretVault(env=env), settings, DRIVERS)
        engine = Engine(registry or nodes, Folders.under(tmp_path), services=service.services())
        made.append(Rig(engine, service, store, env))
        return made[-1]

    yield make
    for rig in made:
        await rig.close()


@pytest.fixture
async def rig(make_rig: MakeRig) -> Rig:
    return await make_rig()


class Graph:
    """API-format prompts with settings, submits, collectors and saves."""

    def __init__(self, url: str, *, key: str = f"env:{KEY_ENV}", poll: float = 0.05) -> None:
        self.prompt: dict[str, Any] = {}
        self.settings = self.api(url, key, poll=poll)

    def api(self, url: str, key: str, *, poll: float = 0.05, node: str | None = None) -> str:
        node = node or f"api{len(self.prompt)}"
        inputs = {"base_url": url, "api_key": key, "poll_interval": poll}
        self.prompt[node] = {"class_type": "APISettings", "inputs": inputs}
        return node

    def flux_inputs(
        self, text: Any, seed: int, settings: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        return {
            "prompt": text,
            "resolution": "0.25 MP",
            "aspect_ratio": "1:1",
            "grounding": False,
            "safety_tolerance": 2,
            "seed": seed,
            "model": "flux-2-pro",
            "api_config": [settings or self.settings, 0],
            **extra,
        }

    def submit(
        self, node: str, text: Any, seed: int, settings: str | None = None, **extra: Any
    ) -> str:
        inputs = self.flux_inputs(text, seed, settings, **extra)
        self.prompt[node] = {"class_type": SUBMIT_FLUX, "inputs": inputs}
        return node

    def collect(self, node: str, tasks: list[str], mode: str = "fail_fast") -> str:
        inputs: dict[str, Any] = {"failure_mode": mode}
        inputs.update({f"task_{n}": [task, 0] for n, task in enumerate(tasks, 1)})
        self.prompt[node] = {"class_type": COLLECT, "inputs": inputs}
        return node

    def save(self, node: str, source: str, slot: int, prefix: str = "fanout") -> str:
        inputs = {"images": [source, slot], "filename_prefix": prefix}
        self.prompt[node] = {"class_type": "SaveImage", "inputs": inputs}
        return node


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client
