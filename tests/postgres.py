"""The machine's PostgreSQL for tests: throwaway databases, made and dropped here.

The server is `COMFYFLEET_TEST_POSTGRES` (a URL naming any database there), by default
the machine's own at 127.0.0.1:5432 (user postgres, trust authentication), which
`.ci/run` starts when it is not running. A test that needs it and cannot reach it
fails with a message saying so: PostgreSQL tests are never skipped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
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


class RoundTrips:
    """A TCP proxy in front of the PostgreSQL server that counts the round trips its
    clients start: each simple query ('Q') and each extended-protocol Sync ('S')."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._server_url = server_url
        self.count = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> str:
        """The URL to connect through (plain TCP, so the messages can be read)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self._server_url)
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
        return urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers += [writer, up_writer]
        for pipe in (self._count(reader, up_writer), self._copy(up_reader, writer)):
            task = asyncio.create_task(pipe)
            self._pipes.add(task)

    async def _count(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        typed = False  # the startup message (and an SSL request) come without a type byte
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                kind = await reader.readexactly(1) if typed else b""
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head, "big") - 4)
                if not typed:
                    typed = int.from_bytes(body[:4], "big") not in (80877103, 80877104)
                elif kind in (b"Q", b"S"):
                    self.count += 1
                writer.write(kind + head + body)
                await writer.drain()
        writer.close()

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
