"""The machine's PostgreSQL for tests: throwaway databases, made and dropped here.

The server is `COMFYFLEET_TEST_POSTGRES` (a URL naming any database there), by default
the machine's own at 127.0.0.1:5432 (user postgres, trust authentication), which
`.ci/run` starts when it is not running. A test that needs it and cannot reach it
fails with a message saying so: PostgreSQL tests are never skipped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

T = TypeVar("T")

SERVER_URL = os.environ.get(
    "COMFYFLEET_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def database_url(name: str, server_url: str = SERVER_URL) -> str:
    """The URL of database `name` on the test server."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def schema_for(location: object) -> str:
    """A PostgreSQL schema name of its own for a test's location (its tmp_path)."""
    return "t_" + hashlib.sha256(str(location).encode()).hexdigest()[:24]


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to the end from synchronous code, whatever loop is running here."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _admin(statement: str) -> None:
    try:
        conn = await asyncpg.connect(SERVER_URL, timeout=10)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {SERVER_URL} ({type(exc).__name__}: {exc}). "
            "Start it (`bash .ci/run` does: pg_ctlcluster --skip-systemctl-redirect "
            "$(ls /etc/postgresql) main start), or set COMFYFLEET_TEST_POSTGRES.",
            pytrace=False,
        )
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def throwaway_database() -> Iterator[str]:
    """A new, empty database on the test server (its URL), dropped afterwards."""
    name = f"comfyfleet_test_{uuid.uuid4().hex[:16]}"
    run_sync(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield database_url(name)
    finally:
        run_sync(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def killed_sessions_settled(url: str, timeout: float = 10.0) -> None:
    """Until no other session of the database at `url` is busy. A client killed mid-commit
    leaves the server finishing what it had sent (the commit may land a moment after the
    kill); reading before then races it."""
    conn = await asyncpg.connect(url)
    try:
        for _ in range(int(timeout / 0.05)):
            busy = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'"
            )
            if busy == 0:
                return
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise AssertionError("a killed client's sessions stayed busy")
