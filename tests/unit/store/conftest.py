"""Fixtures of the store contract suites: every test runs once per store (stores.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.store.base import JobStore
from tests.unit.store.stores import STORES, Clock, StoreFactory, postgres_factory, sqlite_store


@pytest.fixture(params=STORES)
def factory(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "sqlite":
        return sqlite_store
    return postgres_factory(request.getfixturevalue("postgres_url"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(factory: StoreFactory, tmp_path: Path, clock: Clock) -> AsyncIterator[JobStore]:
    opened = factory(tmp_path, clock)
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
def reopen(factory: StoreFactory, tmp_path: Path, clock: Clock) -> Callable[[JobStore], Any]:
    """Close a store and open its data again."""

    async def again(current: JobStore) -> JobStore:
        await current.close()
        fresh = factory(tmp_path, clock)
        await fresh.open()
        return fresh

    return again
