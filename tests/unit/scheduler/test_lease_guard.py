"""LeaseGuard: what a gateway can prove of its lease by its own clock (a test clock
here; the expiry timer runs on the real loop, asked to look at once)."""

from __future__ import annotations

import asyncio

from comfyfleet.scheduler.lease import MARGIN, LeaseGuard

LEASE = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def guarded() -> tuple[LeaseGuard, Clock, list[str]]:
    clock = Clock()
    guard = LeaseGuard(LEASE, clock=clock)
    told: list[str] = []
    guard.on_lost = lambda: told.append("lost")
    guard.on_held = lambda: told.append("held")
    return guard, clock, told


async def test_no_renewal_before_the_margin_fences_and_a_renewal_ends_it() -> None:
    guard, clock, told = guarded()
    guard.renewed(clock.now)
    guard.start()
    clock.now += LEASE * (1 - MARGIN) - 0.01
    assert guard.held
    clock.now += 0.02
    assert not guard.held  # by the clock, before the timer even fires
    guard._expire()  # the timer's call, now rather than in 3 s of real time
    assert told == ["lost"]
    guard.renewed(clock.now)
    assert guard.held and told == ["lost", "held"]
    await asyncio.wait_for(guard.wait_held(), 1)
    guard.stop()


async def test_a_renewal_sent_after_the_lease_ran_out_still_gives_back_what_ran() -> None:
    """A process paused past its lease may renew before its timer fires: what ran
    across the gap is given back all the same."""
    guard, clock, told = guarded()
    guard.renewed(clock.now)
    guard.start()
    clock.now += LEASE * 3  # paused
    guard.renewed(clock.now)
    assert told == ["lost", "held"] and guard.held
    guard.stop()


async def test_others_are_swept_only_after_a_whole_lease_of_renewals() -> None:
    guard, clock, _ = guarded()
    guard.start()
    assert not guard.may_sweep()
    guard.renewed(clock.now)
    clock.now += LEASE / 2
    guard.renewed(clock.now)
    assert not guard.may_sweep()
    guard.failed()  # a heartbeat failed: the stretch starts again
    for _ in range(2):
        clock.now += LEASE / 2
        guard.renewed(clock.now)
        assert not guard.may_sweep()
    clock.now += LEASE / 2
    guard.renewed(clock.now)
    assert guard.may_sweep()
    guard.stop()


def test_without_other_gateways_the_lease_always_holds() -> None:
    clock = Clock()
    guard = LeaseGuard(LEASE, enforced=False, clock=clock)
    clock.now += LEASE * 100
    assert guard.held and guard.may_sweep()


async def test_a_heartbeat_that_hung_breaks_the_stretch() -> None:
    """The store frozen (queries hang, nothing refused): the heartbeat sent before it
    answers after it. Counted from its sending, the stretch looked unbroken, and the
    gateway swept the others the moment the store was back, before they could renew."""
    guard, clock, _ = guarded()
    guard.start()
    guard.renewed(clock.now)
    for _ in range(3):
        clock.now += LEASE / 2
        guard.renewed(clock.now)
    assert guard.may_sweep()
    sent = clock.now
    clock.now += LEASE * 2  # the store froze, then answered this heartbeat
    guard.renewed(sent)
    assert not guard.may_sweep()
    clock.now += LEASE / 2
    guard.renewed(clock.now)  # the lease it renewed had run out by its answer: anew
    for _ in range(2):
        assert not guard.may_sweep()
        clock.now += LEASE / 2
        guard.renewed(clock.now)
    assert guard.may_sweep()
    guard.stop()
