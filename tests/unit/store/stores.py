"""The stores the contract suites run over, each made by a factory at a location.

Calling a factory again with the same location reopens the same data: a SQLite file
in the location, or a PostgreSQL schema named after it in the session's database.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from comfyfleet.store.base import JobStore
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


StoreFactory = Callable[[Path, Clock], JobStore]

STORES = ["sqlite", "postgres"]


def sqlite_store(location: Path, clock: Clock) -> SQLiteStore:
    return SQLiteStore(location / "jobs.db", synchronous="NORMAL", clock=clock)


def postgres_factory(url: str) -> Callable[[Path, Clock], PostgresStore]:
    """Stores in the database at `url`, each location a schema of its own."""

    def make(location: Path, clock: Clock) -> PostgresStore:
        return PostgresStore(url, schema=schema_for(location), clock=clock)

    return make
