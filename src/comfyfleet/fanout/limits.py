"""Per-provider limits under the pools: jobs at once, and job-creating requests per second.

An account often allows fewer parallel jobs than the pool runs (BFL counts
active tasks per key), so an API settings node can ask for less. The limit
belongs to the provider endpoint and key, shared by every prompt using them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable


class Throttle:
    def __init__(
        self,
        concurrency: int = 0,
        rate: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`concurrency` <= 0 and `rate` <= 0 mean no limit."""
        self._slots = asyncio.Semaphore(concurrency) if concurrency > 0 else None
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._clock = clock

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the provider's job slots for the duration of a job."""
        if self._slots is None:
            yield
            return
        async with self._slots:
            yield

    async def pace(self) -> None:
        """Wait for this request's turn under the requests-per-second limit."""
        if not self._interval:
            return
        now = self._clock()
        start = max(now, self._next)
        # Reserve the turn before sleeping, so concurrent callers line up behind it.
        self._next = start + self._interval
        if start > now:
            await asyncio.sleep(start - now)
