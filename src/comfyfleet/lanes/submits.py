"""Prompts being submitted to the backends of one fleet, so a history read can let them
go first."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterator


class Submits:
    """Prompts being submitted to the backends of one fleet. A finished prompt's history
    read lets those already under way go first: a submit is what keeps a backend busy,
    and when many backends finish at once their hand-overs all compete for the CPU.

    Submits are numbered as they start; a wait ends when the oldest still under way is
    newer than the newest at its start (one future per wait, whatever the number of
    submits: a thousand backends finishing together each wait once)."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._under_way: dict[int, None] = {}  # in the order they started
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        number = next(self._numbers)
        self._under_way[number] = None
        try:
            yield
        finally:
            del self._under_way[number]
            self._release()

    def _release(self) -> None:
        oldest = next(iter(self._under_way), None)
        while self._waiting and (oldest is None or self._waiting[0][0] < oldest):
            _, waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def let_pass(self, timeout: float = 1.0) -> None:
        """Wait for the submits under way now (never for a stream of later ones)."""
        if not self._under_way:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((next(reversed(self._under_way)), waiter))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout)
