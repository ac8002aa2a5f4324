"""Journal look-ups of requests about to be sent, gathered into batched reads.

Every paid request is looked up in the journal before it joins a pool (a result to
reuse, a live job to follow). A batch of submits asks for thirty or three hundred at
once; one read each would be as many trips to the store, each a thread hop or a
round trip that delays the jobs behind it. While a read is out, the look-ups asked
for meanwhile wait for the next, which answers them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from comfyfleet.domain.remote_jobs import RemoteJob

#: The most hashes one read asks for (a bound on the query and its answer).
MAX_BATCH = 500


class ReusableJobs(Protocol):
    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]: ...


class BatchedLookups:
    """`reusable(hash)`: the journal's `reusable_remote_jobs` for one hash, sharing reads."""

    def __init__(self, journal: ReusableJobs) -> None:
        self._journal = journal
        self._waiting: dict[str, list[asyncio.Future[RemoteJob | None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def reusable(self, request_hash: str) -> RemoteJob | None:
        loop = asyncio.get_running_loop()
        found: asyncio.Future[RemoteJob | None] = loop.create_future()
        self._waiting.setdefault(request_hash, []).append(found)
        if self._reader is None:
            self._reader = loop.create_task(self._read_all())
        return await found

    async def _read_all(self) -> None:
        """Read for everyone waiting, batch after batch, until nobody is."""
        try:
            while self._waiting:
                await self._read(self._take())
        finally:
            self._reader = None

    def _take(self) -> dict[str, list[asyncio.Future[RemoteJob | None]]]:
        batch: dict[str, list[asyncio.Future[RemoteJob | None]]] = {}
        for request_hash in list(self._waiting)[:MAX_BATCH]:
            batch[request_hash] = self._waiting.pop(request_hash)
        return batch

    async def _read(self, batch: dict[str, list[asyncio.Future[RemoteJob | None]]]) -> None:
        waiters = [waiter for group in batch.values() for waiter in group]
        try:
            found = await self._journal.reusable_remote_jobs(list(batch))
        except Exception as exc:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        except BaseException:  # the reader itself was cancelled: so are its waiters
            for waiter in waiters:
                waiter.cancel()
            for group in self._waiting.values():
                for waiter in group:
                    waiter.cancel()
            self._waiting.clear()
            raise
        for request_hash, group in batch.items():
            for waiter in group:
                if not waiter.done():  # its submit may have been cancelled meanwhile
                    waiter.set_result(found.get(request_hash))
