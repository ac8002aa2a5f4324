"""How long this process has run without a stop, as its hold checks tell (the `awake` a
keep's answer carries): a check that comes late means it was stopped until then."""

from __future__ import annotations

import pytest

from comfyfleet.scheduler.holds import HOLD_CHECK, STALL, Holds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_checks_on_time_add_up_and_a_late_one_starts_again() -> None:
    clock = Clock()
    holds = Holds(clock)
    for _ in range(10):
        clock.now += HOLD_CHECK
        holds.checked()
    assert holds.awake_for() == pytest.approx(10 * HOLD_CHECK)
    clock.now += 7.0  # SIGSTOP: no check ran for seven seconds
    assert holds.awake_for() == 0.0  # asked before the next check: stopped until now
    holds.checked()
    assert holds.awake_for() == 0.0
    clock.now += HOLD_CHECK
    holds.checked()
    assert holds.awake_for() == pytest.approx(HOLD_CHECK)


def test_a_check_a_little_late_is_no_stop() -> None:
    clock = Clock()
    holds = Holds(clock)
    clock.now += HOLD_CHECK + STALL * 0.9  # a busy loop, not a stopped process
    holds.checked()
    assert holds.awake_for() == pytest.approx(HOLD_CHECK + STALL * 0.9)
