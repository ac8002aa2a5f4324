"""The store's single writer thread on a full disk: the failing transaction fails (as
StoreError), nothing committed is lost, and later transactions succeed once there is room."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.jobs import NewJob
from comfyfleet.store.base import StoreError
from comfyfleet.store.sqlite import SQLiteStore
from comfyfleet.store.sqlite_parts.io import GroupWriter
from tests.faults.test_disk_full import fill, small_disk

pytestmark = pytest.mark.faults

__all__ = ["small_disk"]


def new_job(n: int, size: int = 4000) -> NewJob:
    prompt = {"1": {"class_type": "PreviewAny", "inputs": {"source": "x" * size}}}
    return NewJob(f"job{n}", float(n), False, prompt, {}, ["1"])


async def test_writer_survives_disk_full(small_disk: Path) -> None:
    store = SQLiteStore(small_disk / "comfyfleet.db")
    await store.open()
    try:
        kept = [await store.submit(new_job(n)) for n in range(20)]
        filler = small_disk / "filler"
        await asyncio.to_thread(fill, filler)
        # Concurrent submits share group-commit batches: every one fails, none hangs.
        outcomes = await asyncio.gather(
            *(store.submit(new_job(100 + n)) for n in range(50)), return_exceptions=True
        )
        assert all(isinstance(o, StoreError) for o in outcomes), outcomes[:3]
        assert "full" in str(outcomes[0])
        assert await store.get("job0") is not None  # reads still work

        filler.unlink()
        later = await asyncio.gather(*(store.submit(new_job(200 + n)) for n in range(50)))
        assert len(later) == 50
        for job in [*kept, *later]:
            assert await store.get(job.prompt_id) is not None
        for n in range(50):  # the refused ones were not half-written
            assert await store.get(f"job{100 + n}") is None
    finally:
        await store.close()
    # And the file is sound when opened again.
    again = SQLiteStore(small_disk / "comfyfleet.db")
    await again.open()
    try:
        assert await again.get("job249") is not None
    finally:
        await again.close()


class RollbackFails(sqlite3.Connection):
    """A connection whose next ROLLBACK fails (as it may on an I/O error)."""

    failing = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "ROLLBACK" and RollbackFails.failing:
            RollbackFails.failing -= 1
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return super().execute(sql, *args)


async def test_writer_recovers_when_rollback_itself_fails(tmp_path: Path) -> None:
    path = tmp_path / "w.db"

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, factory=RollbackFails)
        conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
        return conn

    def bad(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        raise sqlite3.OperationalError("database or disk is full (injected)")

    def good(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t VALUES (2)")
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])

    writer = GroupWriter(connect)
    try:
        RollbackFails.failing = 1
        with pytest.raises(StoreError, match="disk is full"):
            await writer.submit(bad)
        assert await writer.submit(good) == 1  # the failed insert did not stick
        assert await writer.submit(good) == 2
    finally:
        RollbackFails.failing = 0
        await writer.close()
