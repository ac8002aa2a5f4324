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


#: How much longer than its window a learned pace keeps a request counted.
PACE_SLACK = 0.05
#: Windows held back by a learned pace, with no 429, before it lets one more through.
PROBE_AFTER = 10


class Cooldown:
    """The pace of one provider account's job-creating requests, shared by all of them.

    When the provider says when to come back (`Retry-After`, or an `x-ratelimit-reset`
    with nothing remaining), that is the pause. A fixed `pause` is only for a provider
    that says nothing: `burst` such 429s within `window` seconds mean the key is
    saturated, and concurrent requests retrying on their own would only keep it so.

    It also learns the account's pace, so that 429s become rare: at a 429, the requests
    it let through in the last `per` seconds and that were not refused are what the
    provider takes per `per` seconds, and later requests are spaced to stay within that
    (a sliding window, as providers count). After PROBE_AFTER windows held back by it
    with no 429, it lets one more through, so a limit that grew is found again.
    """

    def __init__(
        self,
        *,
        burst: int = 3,
        window: float = 10.0,
        pause: float = 5.0,
        per: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.burst = burst
        self.window = window
        self.pause = pause
        self.per = per
        self._clock = clock
        self._sleep = sleep
        self._recent: deque[float] = deque()  # 429s without a hint, within `window`
        self._until = 0.0
        self._sent: deque[float] = deque()  # requests let through within `per`
        #: Requests the account takes per `per` seconds, once a 429 has shown it.
        self.limit: int | None = None
        self._limited_at = -math.inf
        self._full_since: float | None = None  # held back by the pace since
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
        self._forget_sent(now)
        if self._sent:
            self._sent.pop()  # this request: refused, so not one the provider counts
        taken = max(1, len(self._sent))
        self.limit = taken if self.limit is None else min(self.limit, taken)
        self._limited_at = now
        if retry_after is not None:
            self.extend(retry_after)
            return
        self._recent.append(now)
        while self._recent and self._recent[0] < now - self.window:
            self._recent.popleft()
        if len(self._recent) >= self.burst:
            self.extend(self.pause)
            self._recent.clear()

    def budget(self, headers: Mapping[str, str]) -> None:
        """An accepted request's rate-limit headers: with nothing left of a budget,
        pause until it resets, rather than learn it from a 429."""
        lowered = {k.lower(): v for k, v in headers.items()}
        for name, value in lowered.items():
            if name.startswith("x-ratelimit-remaining") and value.strip() == "0":
                reset = lowered.get(name.replace("remaining", "reset", 1))
                seconds = None if reset is None else parse_duration(reset)
                if seconds is not None:
                    self.extend(min(seconds, 300.0))

    async def wait(self) -> float:
        """Sleep until a request may go: the pause over, and within the learned pace.
        Returns the seconds waited; the request is then counted as sent."""
        waited = 0.0
        # A loop because another request may extend the pause while we sleep.
        while (left := self._left()) > 0:
            await self._sleep(left)
            waited += left
        if waited == 0:
            self._full_since = None  # demand is below the pace: no backlog to probe with
        self._sent.append(self._clock())
        return waited

    def _left(self) -> float:
        now = self._clock()
        if self._until > now:
            return self._until - now
        if self.limit is None:
            return 0.0
        self._forget_sent(now)
        if len(self._sent) < self.limit:
            return 0.0
        if self._full_since is None:
            self._full_since = now
        probe = PROBE_AFTER * self.per
        if now - self._full_since >= probe and now - self._limited_at >= probe:
            self.limit += 1  # held back by the pace that long with no 429: try one more
            self._full_since = now
            return 0.0
        return max(1e-3, self._sent[0] + self._span - now)

    @property
    def _span(self) -> float:
        # The provider counts a request when it arrives, a little after it was sent.
        return self.per * (1 + PACE_SLACK)

    def _forget_sent(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self._span:
            self._sent.popleft()


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
