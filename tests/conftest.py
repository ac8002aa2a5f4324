"""Shared fixtures: real engines on temporary folders."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from tests.postgres import throwaway_database


@pytest.fixture
def registry() -> NodeRegistry:
    return build_registry(testing=True)


@pytest.fixture
async def engine(registry: NodeRegistry, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(registry, Folders.under(tmp_path))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway database on the machine's PostgreSQL for this test session (each
    test takes a schema of its own in it: see tests/postgres.py)."""
    with throwaway_database() as url:
        yield url


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A throwaway database of this test's own (for servers, which use its default
    schema)."""
    with throwaway_database() as url:
        yield url
