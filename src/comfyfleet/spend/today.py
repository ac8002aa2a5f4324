"""Each tenant's paid jobs and spend of the day (UTC) for the dashboards and /metrics:
read from the journal, at most every FRESH seconds per tenant (a page refreshes four
times a second; the journal's count is the same for every gateway of a store)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from comfyfleet.domain.budgets import Usage, day_start

#: How old a tenant's figures may be when shown (s).
FRESH = 5.0


class UsageReader(Protocol):
    async def paid_usage(self, tenant: str, since: float) -> Usage: ...


class SpendToday:
    def __init__(self, store: UsageReader, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._read: dict[str, tuple[float, Usage]] = {}  # tenant -> (read at, usage)

    async def of(self, tenants: Iterable[str]) -> dict[str, Usage]:
        now = self._clock()
        wanted = set(tenants)
        for tenant in wanted:
            read = self._read.get(tenant)
            # A new day starts every count again: figures read before midnight are stale.
            if read is None or now - read[0] > FRESH or read[0] < day_start(now):
                self._read[tenant] = (now, await self._store.paid_usage(tenant, day_start(now)))
        self._read = {t: v for t, v in self._read.items() if t in wanted}
        return {tenant: self._read[tenant][1] for tenant in wanted}
