"""What this gateway can prove of its own lease, by its own clock.

The store fences job writes by attempt, but not what a process does outside the store
(files, frames to clients). A process can be paused at any moment (GC, swap, a VM
migration, SIGSTOP), and a heartbeat can fail for longer than the lease (a store
outage, a partition). So the gateway keeps its own account: the lease runs `lease`
seconds from the moment the last heartbeat that succeeded was *sent* (the store dates
it no later than that). Shortly before that runs out without a newer renewal, the
gateway is fenced: it stops taking work and holds its in-process attempts back
(fencing.py) before another gateway could take them over.

Taking over works the other way round: a gateway sweeps other gateways' jobs only
after it has itself renewed its lease without a break for a whole lease. When the
store comes back after an outage longer than the lease, every lease in it has run
out; the rule gives every live gateway one lease to renew its own and record what it
finished meanwhile, before anyone may call its jobs orphans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: The part of the lease kept in hand: fenced this long before the lease runs out.
MARGIN = 0.25


class LeaseGuard:
    def __init__(
        self, lease: float, *, enforced: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`enforced`: whether other gateways may take this one's jobs over (a shared
        store); when not, the lease is always held and there is no one to fence out."""
        self.lease = lease
        self.enforced = enforced
        self._clock = clock
        self._valid_until = clock() + lease  # until the join says when it was renewed
        # Since when every heartbeat succeeded (None: the last one failed, or none yet).
        self._connected_since: float | None = None
        self._held = asyncio.Event()
        self._held.set()
        self._expiry: asyncio.TimerHandle | None = None
        self._watching = False  # from `start` to `stop`: the expiry is watched
        # Told when the gateway is fenced (hold back what runs) and when it holds again.
        self.on_lost: Callable[[], None] = lambda: None
        self.on_held: Callable[[], None] = lambda: None

    def start(self) -> None:
        if self.enforced:
            self._watching = True
            self._arm()

    def stop(self) -> None:
        self._watching = False
        self._disarm()

    def _disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    @property
    def held(self) -> bool:
        """Whether the lease is provably this gateway's now (its margin kept)."""
        return not self.enforced or (self._held.is_set() and self._clock() < self._deadline())

    async def wait_held(self) -> None:
        await self._held.wait()

    def now(self) -> float:
        return self._clock()

    def renewed(self, sent_at: float) -> None:
        """A heartbeat sent at `sent_at` (this guard's clock) succeeded."""
        if not self.enforced:
            return
        if self._watching and sent_at >= self._deadline():
            # Sent after the lease ran out (the process was paused, say, before its timer
            # could fire): what ran across the gap may be another gateway's by now.
            self._lapse()
        self._valid_until = max(self._valid_until, sent_at + self.lease)
        now = self._clock()
        if now - sent_at > self.lease / 3:
            # A heartbeat that hung (the store frozen, not refusing) is a break too: other
            # gateways may not have reached the store meanwhile either.
            self._connected_since = None
        if self._connected_since is None:
            self._connected_since = now  # from its answer: the stretch starts here
        was_fenced = not self._held.is_set()
        self._arm()
        if was_fenced and self._clock() < self._deadline():
            log.warning("the lease holds again: taking work again")
            self._held.set()
            self.on_held()

    def failed(self) -> None:
        """A heartbeat failed: the unbroken stretch of renewals starts again."""
        self._connected_since = None

    def may_sweep(self) -> bool:
        """Whether other gateways' jobs may be taken over: this gateway has renewed its
        own lease without a break for a whole lease."""
        since = self._connected_since
        if not self.enforced:
            return True
        return since is not None and self._clock() - since >= self.lease

    def seconds_until(self, part: float) -> float:
        """Seconds from now until `part` of the lease has gone (by the last renewal)."""
        return self._valid_until - (1 - part) * self.lease - self._clock()

    def _deadline(self) -> float:
        return self._valid_until - MARGIN * self.lease

    def _arm(self) -> None:
        self._disarm()
        if not self._watching:
            return
        loop = asyncio.get_running_loop()
        # The loop's clock is monotonic, as this guard's default is.
        delay = max(0.0, self._deadline() - self._clock())
        self._expiry = loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        if self._clock() < self._deadline():  # renewed meanwhile (a later timer is armed)
            self._arm()
            return
        self._lapse()

    def _lapse(self) -> None:
        if self._held.is_set():
            log.error(
                "cannot prove this gateway's lease (no renewal for %.1f s): taking no work "
                "and giving back what runs here until the store answers",
                self._clock() - (self._valid_until - self.lease),
            )
            self._held.clear()
            self._connected_since = None
            self.on_lost()
