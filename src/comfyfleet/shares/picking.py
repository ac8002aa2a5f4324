"""Which backlogged tenant's job goes next.

Stride scheduling over slot-time: each tenant's use of the fleet's slots is counted in
slot-seconds (a tenant of long prompts is charged for them), fading with the share
window, and the backlogged tenant with the least use per unit of weight goes next. An
idle tenant takes no share (work-conserving); one that comes back starts from what it
used of late, so it cannot save up a share while away. Higher priority classes go
first; a tenant's class rises one step per `aging` its oldest prompt has waited, so a
low class waits at most twice that behind a constant high backlog. A tenant at its
`max_running` cap is left out until one of its slots frees.

Pure: the scheduler gives it the counts (see scheduler/fair_share.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from comfyfleet.domain.shares import TenantCounts
from comfyfleet.shares.policy import CLASSES, SharePolicy


class Usage:
    """Slot-seconds per tenant, fading with time constant `window` (an exponential
    moving sum: what was used a window ago counts for about a third)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._used: dict[str, tuple[float, float]] = {}  # tenant -> (slot-seconds, as of)

    def add(self, tenant: str, seconds: float, now: float) -> None:
        self._used[tenant] = (self.of(tenant, now) + max(0.0, seconds), now)

    def of(self, tenant: str, now: float) -> float:
        used, at = self._used.get(tenant, (0.0, now))
        return used * math.exp(-max(0.0, now - at) / self._window)

    def tenants(self) -> list[str]:
        return list(self._used)

    def forget_below(self, seconds: float, now: float) -> None:
        """Drop tenants whose use has faded below `seconds` (bounded memory)."""
        self._used = {t: v for t, v in self._used.items() if self.of(t, now) >= seconds}


def rank(policy: SharePolicy, tenant: str, waited: float) -> int:
    """The tenant's priority class now: its own, raised one step per `aging` waited."""
    steps = int(max(0.0, waited) // policy.aging) if math.isfinite(waited) else 0
    return min(len(CLASSES) - 1, policy.of(tenant).rank + steps)


def order(
    counts: Mapping[str, TenantCounts],
    used: Callable[[str], float],
    policy: SharePolicy,
    now: float,
) -> list[str]:
    """The backlogged tenants not at their cap, in the order their jobs are tried:
    higher class first, then less use per weight, then the longer wait."""

    def key(tenant: str) -> tuple[int, float, float]:
        c = counts[tenant]
        return (
            -rank(policy, tenant, now - c.oldest),
            used(tenant) / policy.of(tenant).weight,
            c.oldest,
        )

    ready = [
        tenant
        for tenant, c in counts.items()
        if c.pending > 0 and not at_cap(policy, tenant, c.running)
    ]
    return sorted(ready, key=key)


def at_cap(policy: SharePolicy, tenant: str, running: int) -> bool:
    cap = policy.of(tenant).max_running
    return cap is not None and running >= cap
