"""What every concern of the PostgreSQL store works through: the pool, transactions,
driver errors wrapped at this boundary, and the named queries of postgres_queries.sql."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import asyncpg

from comfyfleet.store.base import StoreError
from comfyfleet.store.commit_times import CommitTimes
from comfyfleet.store.postgres_parts import webhooks_sql as webhooks
from comfyfleet.store.postgres_parts.url import redact_url
from comfyfleet.store.sql_blocks import load_blocks

T = TypeVar("T")

Q = webhooks.with_deliveries(load_blocks("postgres_queries.sql"))

#: Errors of the driver and the connection, wrapped as StoreError at this boundary.
DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
)

dumps = json.JSONEncoder(separators=(",", ":")).encode
loads = json.loads


def quoted(name: str) -> str:
    """`name` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class PostgresAccess:
    """The base the concern classes share; `PostgresStore` opens and closes the pool."""

    owner: str
    commit_times: CommitTimes
    _url: str
    _pool: Any
    _owner_db: str
    _instance: str
    _clock: Callable[[], float]

    @contextlib.contextmanager
    def _wrapped(self, doing: str | None = None) -> Iterator[None]:
        """Driver errors become StoreError (cause chained), without the URL's password."""
        try:
            yield
        except DRIVER_ERRORS as exc:
            text = f"{type(exc).__name__}: {exc}"
            message = redact_url(self._url, text)
            raise StoreError(f"{doing}: {message}" if doing else message) from exc

    def _db(self) -> Any:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    async def _run(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """`op` with the pool (each statement its own transaction)."""
        db = self._db()
        with self._wrapped():
            return await op(db)

    async def _commit(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """A write of `op` with the pool (each statement its own transaction), timed."""
        db = self._db()
        with self._wrapped(), self.commit_times.timing():
            return await op(db)

    async def _write(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """`op` on one connection, in one transaction, committed before this returns."""
        db = self._db()
        with self._wrapped(), self.commit_times.timing():
            async with db.acquire() as conn, conn.transaction():
                return await op(conn)

    async def _snapshot(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """`op` on one connection, every statement reading the same snapshot."""
        db = self._db()
        with self._wrapped():
            async with (
                db.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                return await op(conn)
