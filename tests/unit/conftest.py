"""A fresh SQLite store per test (the store contract tests make theirs through a factory)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.store.sqlite import SQLiteStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "jobs.db")
    await opened.open()
    yield opened
    await opened.close()
