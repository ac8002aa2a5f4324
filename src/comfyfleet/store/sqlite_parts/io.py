"""Threads that own SQLite connections, so the event loop never waits on the database.

`GroupWriter` is the only writer: one thread, one connection. Callers queue
operations and await them; the thread drains whatever is queued and commits it
in one transaction (group commit), so one fsync covers many operations.

`ReaderPool` runs reads on a few threads, each with its own connection; in WAL
mode they read a consistent snapshot beside the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from comfyfleet.store.base import StoreError
from comfyfleet.store.commit_times import CommitTimes

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]


@dataclass
class WriterStats:
    """Counters for tests and benchmarks (updated by the writer thread only)."""

    transactions: int = 0  # BEGIN IMMEDIATE issued, committed or not
    operations: int = 0  # operations run, including re-runs
    retries: int = 0  # batches rolled back and re-run one operation at a time


@dataclass(eq=False)
class _Request:
    op: Operation[Any]
    future: asyncio.Future[Any]


# What the writer thread hands back per request: (future, ok, result or exception).
_Outcome = tuple["asyncio.Future[Any]", bool, Any]


def wrap_error(exc: BaseException) -> BaseException:
    """Driver errors become StoreError (cause chained); anything else passes through."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error
    return exc


def _settle(outcomes: list[_Outcome]) -> None:
    """Runs on the event loop: complete the futures the writer finished."""
    for future, ok, value in outcomes:
        if future.done():  # the caller gave up waiting
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class GroupWriter:
    """The writer thread. `connect` runs on it, so its connection never leaves it."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        max_batch: int = 256,
        commit_times: CommitTimes | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.stats = WriterStats()
        self.commit_times = commit_times or CommitTimes()
        self._connect = connect
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        # Daemon: a store never closed must not hang interpreter exit; committed work is
        # safe regardless, and SQLite rolls back whatever was in flight.
        self._thread = threading.Thread(
            target=self._main, name="comfyfleet-store-writer", daemon=True
        )
        self._closed = False
        self._thread.start()

    def submit(self, op: Operation[T]) -> asyncio.Future[T]:
        """Queue `op` to run in a write transaction; the future gets its result."""
        if self._closed:
            raise StoreError("the store is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put(_Request(op, future))
        return future

    async def close(self) -> None:
        """Run everything already queued, then stop the thread and close the connection."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        await asyncio.to_thread(self._thread.join)

    # -- writer thread -----------------------------------------------------

    def _main(self) -> None:
        try:
            conn = self._connect()
        except Exception as exc:
            self._refuse_all(exc)
            return
        try:
            self._serve(conn)
        finally:
            conn.close()

    def _refuse_all(self, exc: Exception) -> None:
        """Without a connection every request fails, until close() stops the thread."""
        while (request := self._queue.get()) is not None:
            self._resolve([(request.future, False, wrap_error(exc))])

    def _serve(self, conn: sqlite3.Connection) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            stopping = False
            # Whatever queued up while the last commit was syncing joins this one.
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._resolve(self._run_batch(conn, batch))
            if stopping:
                return

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Request]) -> list[_Outcome]:
        # A request whose caller was cancelled before it started is dropped, not run:
        # best effort, since a cancel can also arrive while the batch runs.
        live = [r for r in batch if not r.future.cancelled()]
        if not live:
            return []
        try:
            results = self._transaction(conn, live)
        except Exception as exc:
            if len(live) == 1:
                return [(live[0].future, False, wrap_error(exc))]
            # One bad operation must not fail its neighbours: re-run them alone.
            self.stats.retries += 1
            return [self._run_alone(conn, request) for request in live]
        return [(r.future, True, value) for r, value in zip(live, results)]

    def _run_alone(self, conn: sqlite3.Connection, request: _Request) -> _Outcome:
        try:
            (value,) = self._transaction(conn, [request])
        except Exception as exc:
            return (request.future, False, wrap_error(exc))
        return (request.future, True, value)

    def _transaction(self, conn: sqlite3.Connection, requests: list[_Request]) -> list[Any]:
        if conn.in_transaction:  # a failed ROLLBACK left one open: end it, or none could begin
            conn.execute("ROLLBACK")
        # IMMEDIATE takes the write lock up front, so no statement can hit SQLITE_BUSY
        # half-way through (another process on the file waits on busy_timeout instead).
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        self.stats.transactions += 1
        try:
            results = []
            for request in requests:
                self.stats.operations += 1
                results.append(request.op(conn))
            conn.execute("COMMIT")
            self.commit_times.add(time.perf_counter() - began)
        except BaseException:
            # A failed write (disk full, I/O error) fails this transaction only: a ROLLBACK
            # that fails too must not hide the cause; the next transaction retries it.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return results

    def _resolve(self, outcomes: list[_Outcome]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(_settle, items)


class ReaderPool:
    """Read connections on worker threads; each read runs in one snapshot."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], size: int = 2) -> None:
        self._connect = connect
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="comfyfleet-store-read")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    async def run(self, read: Operation[T]) -> T:
        """Run `read` on a reader thread; driver errors become StoreError."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, read)

    async def close(self) -> None:
        """Wait for running reads, then close every connection."""
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        # The threads are gone, so closing their connections from here is safe.
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    def _call(self, read: Operation[T]) -> T:
        try:
            conn = self._connection()
            # One read transaction: every query of this read sees the same snapshot.
            conn.execute("BEGIN")
            try:
                return read(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise wrap_error(exc) from exc

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn
