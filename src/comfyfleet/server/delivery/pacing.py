"""A token bucket: bursts pass at once, a steady stream settles to a rate."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second; one per send."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()

    def wait(self) -> float:
        """Seconds until a whole token is there (0 or less: one is)."""
        return self._stamp + (1.0 - self._tokens) / self.rate - self._clock()

    def take(self) -> None:
        """Spend a token (refilled for the time since the last one first)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate) - 1.0
        self._stamp = now
