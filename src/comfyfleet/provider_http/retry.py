"""When to try again: jittered backoff, a per-provider cooldown, and rate-limit headers."""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# Past this, 2**attempt only overflows; the cap has long been reached anyway.
_MAX_EXPONENT = 62
# One generator for every backoff that brings none: seeding one per client reads the
# OS's entropy each time, and clients are made per job.
_RNG = random.Random()


class Backoff:
    """Full-jitter exponential backoff: spreads retries of many clients over the window."""

    def __init__(
        self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None
    ) -> None:
        self.base = base
        self.cap = cap
        self._rng = rng or _RNG

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0 for the first retry)."""
        ceiling = min(self.cap, self.base * 2 ** min(max(attempt, 0), _MAX_EXPONENT))
        return self._rng.uniform(0, ceiling)


class Cooldown:
    """A pause shared by every request to one provider.

    One 429 may be bad luck; `burst` of them within `window` seconds mean the key
    is saturated, and concurrent requests retrying on their own would only keep
    it saturated. A `Retry-After` from the provider sets the pause directly.
    """

    def __init__(
        self,
        *,
        burst: int = 3,
        window: float = 10.0,
        pause: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.burst = burst
        self.window = window
        self.pause = pause
        self._clock = clock
        self._sleep = sleep
        self._recent: deque[float] = deque()
        self._until = 0.0
        #: 429s recorded, and pauses begun (from none running), since it was made.
        self.rate_limited_count = 0
        self.pauses = 0

    def remaining(self) -> float:
        return max(0.0, self._until - self._clock())

    def extend(self, seconds: float) -> None:
        """Hold every request for at least `seconds` from now."""
        now = self._clock()
        if seconds > 0 and self._until <= now:
            self.pauses += 1
        self._until = max(self._until, now + max(0.0, seconds))

    def rate_limited(self, retry_after: float | None = None) -> None:
        """Record a 429; `retry_after` is the provider's own estimate, if it sent one."""
        self.rate_limited_count += 1
        now = self._clock()
        self._recent.append(now)
        while self._recent and self._recent[0] < now - self.window:
            self._recent.popleft()
        if retry_after is not None:
            self.extend(retry_after)
        if len(self._recent) >= self.burst:
            self.extend(self.pause)
            self._recent.clear()

    async def wait(self) -> float:
        """Sleep until the cooldown is over; returns the seconds waited."""
        waited = 0.0
        # A loop because another request may extend the cooldown while we sleep.
        while (left := self.remaining()) > 0:
            await self._sleep(left)
            waited += left
        return waited


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds: either delta-seconds or an HTTP date."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(value: str) -> float | None:
    """OpenAI-style reset durations ("1s", "6m0s", "250ms", "1h2m3.5s") or plain seconds."""
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def ratelimit_reset(headers: Mapping[str, str]) -> float | None:
    """Seconds until the exhausted `x-ratelimit-*` budget resets.

    Only budgets whose `remaining` is 0 matter; when none says so, the longest
    reset is the safe guess.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    resets: dict[str, float] = {}
    for name, raw in lowered.items():
        if name.startswith("x-ratelimit-reset"):
            seconds = parse_duration(raw)
            if seconds is not None:
                resets[name.removeprefix("x-ratelimit-reset")] = seconds
    if not resets:
        return None
    exhausted = [
        seconds
        for suffix, seconds in resets.items()
        if lowered.get("x-ratelimit-remaining" + suffix, "").strip() == "0"
    ]
    return max(exhausted or resets.values())


def retry_after_from(headers: Mapping[str, str], *, limit: float = 300.0) -> float | None:
    """The provider's wait hint from any of the usual headers, capped at `limit`.

    The cap keeps a misbehaving relay (`Retry-After: 86400`) from parking a job
    for a day; the retry budget then decides.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    seconds = None
    if "retry-after-ms" in lowered:
        ms = parse_retry_after(lowered["retry-after-ms"])
        seconds = None if ms is None else ms / 1000
    if seconds is None:
        seconds = parse_retry_after(lowered.get("retry-after"))
    if seconds is None:
        seconds = ratelimit_reset(lowered)
    return None if seconds is None else min(seconds, limit)
