"""Shared fixtures: real engines on temporary folders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry


@pytest.fixture
def registry() -> NodeRegistry:
    return build_registry(testing=True)


@pytest.fixture
async def engine(registry: NodeRegistry, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(registry, Folders.under(tmp_path))
    yield eng
    eng.close()
