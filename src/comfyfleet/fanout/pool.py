"""A bounded pool shared by every prompt: so many jobs run, so many more wait, the rest queue.

Jobs start in arrival order. Joining a pool that is full waits asynchronously
for room, reporting how many jobs are ahead, so a node can show why it waits;
nothing ever blocks the event loop or another prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from comfyfleet.fanout.settings import PoolSize

OnWait = Callable[[int], None]


class Place:
    """One job's place in a pool: waiting, admitted (pending), running, then left."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._changed = asyncio.Event()
        self.admitted = False
        self.running = False
        self.left = False

    def _notify(self) -> None:
        self._changed.set()

    async def _changes(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def wait_running(self) -> None:
        """Return once this job holds a running slot."""
        while not self.running:
            if self.left:
                raise RuntimeError("this place has left its pool")
            await self._changes()

    def leave(self) -> None:
        """Give the place (and its running slot) back; safe to call more than once."""
        if not self.left:
            self.left = True
            self._pool._release(self)


class Pool:
    def __init__(self, name: str, size: PoolSize) -> None:
        self.name = name
        self.concurrency = size.concurrency
        self.pending = size.pending
        self._line: deque[Place] = deque()  # not running yet, in arrival order
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def join(self, on_wait: OnWait | None = None) -> Place:
        """A place in the pool once there is room for it (running or pending).

        While the pool is full, `on_wait` hears how many jobs are ahead whenever
        that number changes. Cancelling the wait gives the place back.
        """
        place = Place(self)
        self._line.append(place)
        self._pump()
        reported: int | None = None
        try:
            while not place.admitted:
                ahead = self._ahead(place)
                if on_wait is not None and ahead != reported:
                    on_wait(ahead)
                    reported = ahead
                await place._changes()
        except BaseException:
            place.leave()
            raise
        return place

    def _ahead(self, place: Place) -> int:
        for index, queued in enumerate(self._line):
            if queued is place:
                return index
        return 0

    def _release(self, place: Place) -> None:
        if place.running:
            self._running -= 1
        else:
            with contextlib.suppress(ValueError):  # already gone
                self._line.remove(place)
        place._notify()
        self._pump()

    def _pump(self) -> None:
        """Start what fits, admit what fits behind it, and tell every waiter it moved."""
        while self._running < self.concurrency and self._line:
            place = self._line.popleft()
            place.admitted = place.running = True
            self._running += 1
            place._notify()
        for index, place in enumerate(self._line):
            if index < self.pending:
                place.admitted = True
            place._notify()
