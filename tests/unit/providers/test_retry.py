from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from comfyfleet.provider_http.retry import (
    PACE_SLACK,
    PROBE_AFTER,
    Backoff,
    Cooldown,
    parse_duration,
    parse_retry_after,
    ratelimit_reset,
    retry_after_from,
)
from tests.helpers import FakeTime


def test_backoff_is_full_jitter_under_a_growing_ceiling() -> None:
    backoff = Backoff(base=0.5, cap=4.0, rng=random.Random(7))
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 4.0), (5000, 4.0)]:
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # spread over the whole window


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    first = [Backoff(rng=random.Random(3)).delay(2) for _ in range(3)]
    second = [Backoff(rng=random.Random(3)).delay(2) for _ in range(3)]
    assert first == second


async def test_cooldown_starts_after_a_burst_within_the_window() -> None:
    fake = FakeTime(100.0)
    cooldown = Cooldown(burst=3, window=10.0, pause=5.0, clock=fake.clock, sleep=fake.sleep)
    cooldown.rate_limited()
    fake.now += 20.0  # outside the window: forgotten
    cooldown.rate_limited()
    cooldown.rate_limited()
    assert cooldown.remaining() == 0
    cooldown.rate_limited()
    assert cooldown.remaining() == pytest.approx(5.0)
    assert await cooldown.wait() == pytest.approx(5.0)
    assert cooldown.remaining() == 0


async def test_retry_after_sets_the_cooldown_and_never_shortens_it() -> None:
    fake = FakeTime(100.0)
    cooldown = Cooldown(burst=10, clock=fake.clock, sleep=fake.sleep)
    cooldown.rate_limited(retry_after=3.0)
    cooldown.rate_limited(retry_after=1.0)
    assert cooldown.remaining() == pytest.approx(3.0)
    assert await cooldown.wait() == pytest.approx(3.0)


def test_parse_retry_after_seconds_and_dates() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-3") == 0.0
    http_date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(http_date, now=now) == pytest.approx(30.0)
    assert parse_retry_after(format_datetime(now - timedelta(seconds=5), usegmt=True), now=now) == 0
    for junk in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(junk) is None


def test_parse_duration() -> None:
    assert parse_duration("1s") == 1.0
    assert parse_duration("250ms") == 0.25
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("2") == 2.0
    assert parse_duration("2 fortnights") is None


def test_ratelimit_reset_prefers_the_exhausted_budget() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "2s",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "1m",
    }
    assert ratelimit_reset(headers) == 2.0
    del headers["x-ratelimit-remaining-requests"]
    assert ratelimit_reset(headers) == 60.0  # nothing says which: the longest
    assert ratelimit_reset({}) is None


def test_retry_after_from_headers_in_order_and_capped() -> None:
    assert retry_after_from({"Retry-After": "3", "x-ratelimit-reset-requests": "9s"}) == 3.0
    assert retry_after_from({"retry-after-ms": "1500", "Retry-After": "3"}) == 1.5
    assert retry_after_from({"x-ratelimit-reset-requests": "9s"}) == 9.0
    assert retry_after_from({"Retry-After": "86400"}, limit=60.0) == 60.0
    assert retry_after_from({}) is None


async def test_a_pause_the_provider_names_is_the_pause() -> None:
    """Ten 429s saying `Retry-After: 1` pause for one second: the fixed pause is only
    for 429s that say nothing."""
    fake = FakeTime(100.0)
    cooldown = Cooldown(burst=3, window=10.0, pause=5.0, clock=fake.clock, sleep=fake.sleep)
    for _ in range(10):
        cooldown.rate_limited(retry_after=1.0)
    assert cooldown.remaining() == pytest.approx(1.0)
    assert await cooldown.wait() == pytest.approx(1.0)


async def test_the_pace_a_429_shows_is_kept_so_later_requests_are_not_refused() -> None:
    fake = FakeTime(100.0)
    cooldown = Cooldown(per=1.0, clock=fake.clock, sleep=fake.sleep)
    for _ in range(30):  # thirty at once: nothing is known of the account yet
        assert await cooldown.wait() == 0
    fake.now += 0.05
    for _ in range(10):  # the provider took twenty of them
        cooldown.rate_limited(retry_after=1.0)
    assert cooldown.limit == 20
    waited = [await cooldown.wait() for _ in range(10)]  # the ten again, after the pause
    assert waited[0] == pytest.approx(1.0) and waited[1:] == [0.0] * 9
    # Twenty more now would pass the twenty a second: they go as the window moves on.
    for _ in range(10):
        assert await cooldown.wait() == 0
    # (a little over the window: the provider counts a request when it arrives)
    assert await cooldown.wait() == pytest.approx(1.0 * (1 + PACE_SLACK))


async def test_held_back_by_the_pace_long_enough_without_a_429_it_tries_one_more() -> None:
    fake = FakeTime(0.0)
    cooldown = Cooldown(per=1.0, clock=fake.clock, sleep=fake.sleep)
    await cooldown.wait()
    await cooldown.wait()
    cooldown.rate_limited()  # one of the two refused, no hint: a limit of one a second
    assert cooldown.limit == 1
    for _ in range(PROBE_AFTER):  # a steady backlog at one a second, none refused
        await cooldown.wait()
    assert cooldown.limit == 1
    await cooldown.wait()
    await cooldown.wait()
    assert cooldown.limit == 2


async def test_an_exhausted_budget_in_an_accepted_answer_pauses_until_its_reset() -> None:
    fake = FakeTime(0.0)
    cooldown = Cooldown(clock=fake.clock, sleep=fake.sleep)
    cooldown.budget({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1s"})
    assert cooldown.remaining() == 0
    cooldown.budget({"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "2s"})
    assert cooldown.remaining() == pytest.approx(2.0)
    cooldown.budget({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"})
    assert cooldown.remaining() == pytest.approx(2.0)
