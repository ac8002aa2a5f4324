"""How long the store's commits take: a plain tally, for whoever reports it (metrics).

Each store times every write from its start until it is committed (SQLite: one group
commit of queued writes, from BEGIN IMMEDIATE to COMMIT; PostgreSQL: one write
statement or transaction) and counts it here under the first bound it does not exceed.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Upper bounds, in seconds, of the tally's buckets (the last one is +Inf).
BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class CommitTally:
    """Commits so far: how many fell under each bound (not cumulative; the last count is
    those above every bound), and their total time."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total_seconds: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class CommitTimes:
    """Thread-safe: SQLite's writer thread adds, the event loop reads."""

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        index = bisect.bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[index] += 1
            self._total += seconds

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Time the block; a block that raises is not counted (nothing was committed)."""
        began = time.perf_counter()
        yield
        self.add(time.perf_counter() - began)

    def tally(self) -> CommitTally:
        with self._lock:
            return CommitTally(self._bounds, tuple(self._counts), self._total)
