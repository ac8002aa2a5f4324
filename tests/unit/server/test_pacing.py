"""The token bucket behind socket writes and `status` broadcasts."""

from __future__ import annotations

import pytest

from comfyfleet.server.delivery.pacing import TokenBucket
from tests.helpers import FakeTime


def test_a_burst_goes_at_once_then_sends_settle_to_the_rate() -> None:
    time = FakeTime(50.0)
    bucket = TokenBucket(rate=200.0, burst=4.0, clock=time.clock)
    for _ in range(4):  # a quiet socket writes each frame at once
        assert bucket.wait() <= 0
        bucket.take()
    assert bucket.wait() == pytest.approx(0.005)  # then one write per 1/200 s
    time.now += 0.005
    assert bucket.wait() <= 1e-12
    bucket.take()
    assert bucket.wait() == pytest.approx(0.005)


def test_idle_time_refills_no_more_than_the_burst() -> None:
    time = FakeTime()
    bucket = TokenBucket(rate=20.0, burst=2.0, clock=time.clock)
    bucket.take()
    bucket.take()
    time.now += 60.0  # a long quiet spell
    bucket.take()
    bucket.take()
    assert bucket.wait() == pytest.approx(0.05)  # only `burst` went out at once
