"""The stores the contract suites run over, each made by a factory at a location.

Calling a factory again with the same location reopens the same data: a SQLite file
in the location, or a PostgreSQL schema named after it in the session's database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from comfyfleet.domain.jobs import Job
from comfyfleet.store.base import MAX_CANDIDATES, JobStore
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.store.sqlite import SQLiteStore
from tests.postgres import schema_for


class Clock:
    """A settable clock, so timestamps and ages are exact."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


StoreFactory = Callable[..., JobStore]  # (location, clock, owner=None)

STORES = ["sqlite", "postgres"]


def sqlite_store(location: Path, clock: Clock, owner: str | None = None) -> SQLiteStore:
    return SQLiteStore(location / "jobs.db", synchronous="NORMAL", clock=clock, owner=owner)


def postgres_factory(url: str) -> Callable[..., PostgresStore]:
    """Stores in the database at `url`, each location a schema of its own."""

    def make(location: Path, clock: Clock, owner: str | None = None) -> PostgresStore:
        return PostgresStore(url, schema=schema_for(location), clock=clock, owner=owner)

    return make


def kill_while_submitting(child_code: str, args: list[str], wanted: int) -> list[str]:
    """Run `child_code` (a script that prints "open", then each id once its submit is
    committed), SIGKILL it after `wanted` ids; every id it printed before the kill."""
    child = subprocess.Popen(
        [sys.executable, "-c", child_code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stdout is not None
    committed: list[str] = []
    try:
        for line in child.stdout:
            if line.strip() != "open":
                committed.append(line.strip())
            if len(committed) >= wanted:
                break
        child.send_signal(signal.SIGKILL)
        # Whatever was printed before the kill landed counts too.
        committed += [line.strip() for line in child.stdout if line.strip()]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return committed


async def claim_next(store: JobStore, lane: str, only: str | None = None) -> Job | None:
    """Claim the first claimable job on `lane` (the job `only`, when named), as a slot
    does: `candidates`, then the fenced `claim_job`."""
    for job in await store.candidates(MAX_CANDIDATES):
        if only in (None, job.prompt_id) and (taken := await store.claim_job(job, lane)):
            return taken
    return None


async def reserve_next(store: JobStore, lane: str) -> Job | None:
    """Set the first claimable job aside for `lane`: `candidates`, then `reserve_job`."""
    for job in await store.candidates(MAX_CANDIDATES):
        if (taken := await store.reserve_job(job, lane)) is not None:
            return taken
    return None
