"""A bounded pool shared by every prompt: so many jobs run, so many more wait, the rest queue.

Jobs start in arrival order. Joining a pool that is full waits asynchronously
for room, reporting how many jobs are ahead, so a node can show why it waits;
nothing ever blocks the event loop or another prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable

from comfyfleet.fanout.settings import PoolSize

#: Seconds between two "N ahead" reports to one waiter. Every job that starts moves
#: every waiter up by one: reporting each move would send waiters**2 / 2 texts.
WAIT_REPORT_INTERVAL = 1.0

OnWait = Callable[[int], None]


class Place:
    """One job's place in a pool: waiting, admitted (pending), running, then left."""

    def __init__(self, pool: Pool, on_wait: OnWait | None = None) -> None:
        self._pool = pool
        self._changed = asyncio.Event()
        self.on_wait = on_wait
        self.reported: int | None = None  # the last "ahead" told to `on_wait`
        self.admitted = False
        self.running = False
        self.left = False

    def _notify(self) -> None:
        self._changed.set()

    async def _changes(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    def _report(self, ahead: int) -> None:
        if self.on_wait is not None and ahead != self.reported:
            self.reported = ahead
            self.on_wait(ahead)

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
        self._reports: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def join(self, on_wait: OnWait | None = None) -> Place:
        """A place in the pool once there is room for it (running or pending).

        While the pool is full, `on_wait` hears how many jobs are ahead: at once,
        then when that number has changed, at most every WAIT_REPORT_INTERVAL.
        Cancelling the wait gives the place back.
        """
        place = Place(self, on_wait)
        self._line.append(place)
        self._pump()
        try:
            if not place.admitted:
                place._report(len(self._line) - 1)  # it is last in line
                self._schedule_reports()
            while not place.admitted:
                await place._changes()
        except BaseException:
            place.leave()
            raise
        return place

    def _schedule_reports(self) -> None:
        loop = asyncio.get_running_loop()
        # A timer left behind by an event loop that has ended never fires: replace it.
        if self._reports is None or self._reports[0] is not loop:
            self._reports = (loop, loop.call_later(WAIT_REPORT_INTERVAL, self._report_waiting))

    def _report_waiting(self) -> None:
        """One pass over the line per interval tells every waiter whose place moved."""
        self._reports = None
        waiting = False
        for ahead, place in enumerate(self._line):
            if not place.admitted:
                place._report(ahead)
                waiting = True
        if waiting:
            self._schedule_reports()

    def _release(self, place: Place) -> None:
        if place.running:
            self._running -= 1
        else:
            with contextlib.suppress(ValueError):  # already gone
                self._line.remove(place)
        place._notify()
        self._pump()

    def _pump(self) -> None:
        """Start what fits and admit what fits behind it; wake only places that changed."""
        while self._running < self.concurrency and self._line:
            place = self._line.popleft()
            place.admitted = place.running = True
            self._running += 1
            place._notify()
        for place in itertools.islice(self._line, self.pending):
            if not place.admitted:
                place.admitted = True
                place._notify()
