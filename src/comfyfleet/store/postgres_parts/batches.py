"""Group commit for the PostgreSQL store: writes of one kind that arrive while others of
that kind are being written go out together, as one statement (one round trip, one
commit), when one of the writes under way returns. A write that finds fewer than
`at_once` under way goes out at once: a quiet store adds no delay, a busy one makes
fewer, larger commits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Writes at most in one statement (its parameters grow with them).
MOST = 64
#: Statements of one kind under way at once.
AT_ONCE = 2


class Batches(Generic[T, R]):
    """`put` one item; `write` gets a batch of items and returns their results in order.

    A batch that fails is written again one item at a time, so a write the statement
    refuses fails alone. A caller that stops waiting before its item went out takes it
    back; once out, it is written (as a single write that returned late would be)."""

    def __init__(
        self,
        write: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        most: int = MOST,
        at_once: int = AT_ONCE,
    ) -> None:
        self._write = write
        self._most = most
        self._at_once = at_once
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._writers: set[asyncio.Task[None]] = set()

    async def put(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if len(self._writers) < self._at_once:
            writer = asyncio.create_task(self._drain(), name="store-batches")
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch = [(item, f) for item, f in self._waiting[: self._most] if not f.done()]
            del self._waiting[: self._most]
            if batch:
                await self._write_batch(batch)

    async def _write_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1:
                for one in batch:
                    await self._write_batch([one])
                return
            _settle(batch[0][1], exc)
            return
        except BaseException:
            for _, future in batch:
                future.cancel()  # the writer was stopped (the loop ends): so are its callers
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def _settle(future: asyncio.Future[R], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
