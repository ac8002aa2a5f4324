"""The tenants' shares as this gateway sees them (see shares/picking.py for the method).

The store's counts (each tenant's claimable and running jobs, fleet-wide) are read at
most every REFRESH_SHARED (REFRESH_ALONE for a store no other gateway shares) and kept
current here in between, as jobs arrive and are taken. The use of slots is counted
here, for this gateway's slots: with several gateways on one store each splits its own
slots by the weights, so the fleet's add up the same way."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.shares import TenantCounts
from comfyfleet.scheduler.attempts import Running
from comfyfleet.shares.picking import Usage, at_cap, order
from comfyfleet.shares.policy import SharePolicy, TenantPolicy
from comfyfleet.store.base import JobStore


@dataclass(frozen=True)
class TenantShare:
    """One tenant's part of the fleet, as this gateway sees it."""

    tenant: str
    pending: int  # claimable jobs, fleet-wide
    running: int  # fleet-wide
    used: float  # slot-seconds of this gateway's slots, fading with the share window
    share: float  # its part of all tenants' use here (0 to 1)
    policy: TenantPolicy

    def as_json(self) -> dict[str, Any]:
        policy = self.policy
        return {
            "tenant": self.tenant,
            "pending": self.pending,
            "running": self.running,
            "slot_seconds": self.used,
            "share": self.share,
            "weight": policy.weight,
            "priority": policy.priority,
            "max_running": policy.max_running,
            "max_queued": policy.max_queued,
            "lanes": list(policy.lanes),
        }


#: How stale the store's counts may get before a claim reads them again (s): with other
#: gateways on the store, and alone (every change but cancels and recoveries is counted
#: here as it happens; the read costs about 10 ms with 5,000 prompts waiting).
REFRESH_SHARED = 0.25
REFRESH_ALONE = 2.0
#: Use below this (slot-seconds) is forgotten.
FADED = 0.01


class FairShare:
    def __init__(
        self,
        policy: SharePolicy,
        store: JobStore,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.enabled = enabled  # one tenant only (no authentication, no policy): off
        self._store = store
        self._clock = clock
        self._wall = wall
        self.usage = Usage(policy.window)
        self.counts: dict[str, TenantCounts] = {}
        self._read_at = -math.inf
        self._refresh_every = REFRESH_SHARED if store.shared else REFRESH_ALONE
        self._reading: asyncio.Task[dict[str, TenantCounts]] | None = None

    async def order(self, running: Iterable[Running]) -> list[str] | None:
        """The backlogged tenants not at their cap, in the order their jobs are tried;
        None when one queue order serves all (one tenant waits, and no tenant has a cap
        or a lane filter)."""
        if not self.enabled:
            return None
        if self._clock() - self._read_at > self._refresh_every:
            await self._refresh()
        waiting = sum(c.pending > 0 for c in self.counts.values())
        if waiting <= 1 and not self.policy.capped:
            return None
        now = self._clock()
        held: dict[str, float] = {}  # slot-seconds of runs still holding a slot here
        for run in running:
            if not run.handle.released.is_set():
                tenant = run.job.tenant
                held[tenant] = held.get(tenant, 0.0) + now - run.began
        return order(
            self.counts,
            lambda tenant: self.usage.of(tenant, now) + held.get(tenant, 0.0),
            self.policy,
            self._wall(),
        )

    async def current(self) -> list[TenantShare]:
        """Every tenant with work in the store, used slots of late, or a policy: its
        counts, its use (slot-seconds, fading) and share of that use here, its settings;
        the counts read again first when stale."""
        if self._clock() - self._read_at > self._refresh_every:
            await self._refresh()
        now = self._clock()
        names = set(self.counts) | set(self.usage.tenants()) | set(self.policy.tenants)
        used = {tenant: self.usage.of(tenant, now) for tenant in names}
        total = sum(used.values())
        shares = []
        for tenant in sorted(names):
            counts, policy = self._of(tenant), self.policy.of(tenant)
            shares.append(
                TenantShare(
                    tenant,
                    counts.pending,
                    counts.running,
                    round(used[tenant], 3),
                    round(used[tenant] / total, 4) if total > 0 else 0.0,
                    policy,
                )
            )
        return shares

    def may_start(self, tenant: str) -> bool:
        """Whether the tenant is below its cap on running jobs, as counted here."""
        return not at_cap(self.policy, tenant, self._of(tenant).running)

    def arrived(self, tenant: str) -> None:
        counts = self._of(tenant)
        counts.pending += 1
        counts.oldest = min(counts.oldest, self._wall())

    def taking(self, tenant: str) -> None:
        """A slot here is taking one of the tenant's jobs (counted before the write, so
        that slots taking at once do not pass its cap together)."""
        counts = self._of(tenant)
        counts.pending = max(0, counts.pending - 1)
        counts.running += 1

    def not_taken(self, tenant: str) -> None:
        counts = self._of(tenant)
        counts.running = max(0, counts.running - 1)

    def released(self, tenant: str, seconds: float) -> None:
        """A run of the tenant's freed its slot after `seconds`."""
        now = self._clock()
        self.usage.add(tenant, seconds, now)
        counts = self._of(tenant)
        counts.running = max(0, counts.running - 1)

    def _of(self, tenant: str) -> TenantCounts:
        counts = self.counts.get(tenant)
        if counts is None:
            counts = self.counts[tenant] = TenantCounts()
        return counts

    async def _refresh(self) -> None:
        """Read the counts again (slots that ask meanwhile share the read, as the queue's
        front is shared in candidates.py); the first to wake keeps what it read."""
        if self._reading is None:
            self._reading = asyncio.create_task(self._store.tenant_counts(), name="tenant-counts")
            self._reading.add_done_callback(self._read_done)
        counts = await asyncio.shield(self._reading)
        if self._read_at < self._clock() - self._refresh_every:
            self.counts = dict(counts)
            self._read_at = self._clock()
            self.usage.forget_below(FADED, self._clock())

    def _read_done(self, task: asyncio.Task[dict[str, TenantCounts]]) -> None:
        if self._reading is task:
            self._reading = None
        if not task.cancelled():
            task.exception()  # seen here, whoever waited for it
