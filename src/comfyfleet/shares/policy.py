"""What the operator says each tenant may have of the fleet (`[tenants.NAME]` tables,
and `[fair_share]` for the whole fleet).

- `weight` (default 1): a backlogged tenant's share of the fleet's slot-time is its
  weight over the weights of all backlogged tenants.
- `max_running`: slots it may hold at once, fleet-wide (none: no cap).
- `max_queued`: prompts it may have waiting; past that a submit is refused (429).
- `priority`: `high`, `normal` (default) or `low`; a higher class goes first. A
  prompt that waits rises one class per `[fair_share] aging` (default 60 s), so a low
  one waits at most twice that behind a constant high backlog before it competes as
  high (then by shares), and never starves.
- `lanes`: the lanes it may run on (shell patterns such as `backend:gpu-*`, `local`);
  none: every lane.
- `paid_jobs_per_day`: paid API jobs (fan-out and provider nodes) its prompts may send
  per calendar day in UTC, fleet-wide (none: no cap); see comfyfleet.spend.
- `spend_per_day`: US dollars those jobs may cost per calendar day in UTC, by the
  `[prices]` table (none: no cap).

`[fair_share] window` (default 60 s): slot-time is counted over that much of the past,
so a tenant idle for a window comes back with a clean slate, and no longer.
`[fair_share] enabled = false`: one queue order for every tenant, as ComfyUI's (the
caps still hold).
Tenants not named get `[tenants.default]`'s settings for weight and priority, never its
caps (a cap is one tenant's).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.durations import parse_duration
from comfyfleet.tenants import DEFAULT_TENANT, check_tenant_name

#: Priority classes, lowest first.
CLASSES = ("low", "normal", "high")
DEFAULT_WINDOW = 60.0
DEFAULT_AGING = 60.0
MAX_WEIGHT = 1_000_000.0
MAX_COUNT = 100_000_000
MAX_DOLLARS = 1_000_000_000.0


@dataclass(frozen=True)
class TenantPolicy:
    weight: float = 1.0
    max_running: int | None = None
    max_queued: int | None = None
    priority: str = "normal"
    lanes: tuple[str, ...] = ()  # lane name patterns; empty: every lane
    paid_jobs_per_day: int | None = None
    spend_per_day: float | None = None  # US dollars

    @property
    def rank(self) -> int:
        return CLASSES.index(self.priority)

    def allows_lane(self, lane: str) -> bool:
        return not self.lanes or any(fnmatch.fnmatchcase(lane, p) for p in self.lanes)


@dataclass(frozen=True)
class SharePolicy:
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    window: float = DEFAULT_WINDOW
    aging: float = DEFAULT_AGING
    enabled: bool = True  # false: one queue order for every tenant (caps still hold)

    def of(self, tenant: str) -> TenantPolicy:
        found = self.tenants.get(tenant)
        if found is not None:
            return found
        base = self.tenants.get(DEFAULT_TENANT)
        if base is None:
            return TenantPolicy()
        return TenantPolicy(weight=base.weight, priority=base.priority, lanes=base.lanes)

    @property
    def capped(self) -> bool:
        """Whether any tenant has a cap on running slots or a lane filter."""
        return any(p.max_running is not None or p.lanes for p in self.tenants.values())


def parse_policy(tenants: Any, fair_share: Any) -> SharePolicy:
    """`[tenants.*]` and `[fair_share]` tables; ValueError names what is wrong."""
    if tenants is None:
        tenants = {}
    if not isinstance(tenants, dict):
        raise ValueError("[tenants] must hold one table per tenant: [tenants.NAME]")
    parsed = {check_tenant_name(name): _tenant(name, table) for name, table in tenants.items()}
    settings = {} if fair_share is None else fair_share
    if not isinstance(settings, dict) or set(settings) - {"window", "aging", "enabled"}:
        raise ValueError("[fair_share] knows window and aging (durations) and enabled")
    window = _duration(settings.get("window", DEFAULT_WINDOW), "[fair_share] window")
    aging = _duration(settings.get("aging", DEFAULT_AGING), "[fair_share] aging")
    enabled = settings.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError("[fair_share] enabled must be true or false")
    return SharePolicy(parsed, window, aging, enabled)


_KEYS = {
    "weight",
    "max_running",
    "max_queued",
    "priority",
    "lanes",
    "paid_jobs_per_day",
    "spend_per_day",
}


def _tenant(name: str, table: Any) -> TenantPolicy:
    where = f"[tenants.{name}]"
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    weight = table.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ValueError(f"{where} weight must be a number")
    if not 0 < weight <= MAX_WEIGHT:
        raise ValueError(f"{where} weight must be above 0 and at most {MAX_WEIGHT:g}")
    priority = table.get("priority", "normal")
    if priority not in CLASSES:
        raise ValueError(f"{where} priority must be one of {', '.join(CLASSES)}")
    lanes = table.get("lanes", [])
    if not isinstance(lanes, list) or not all(isinstance(p, str) and p for p in lanes):
        raise ValueError(f"{where} lanes must be a list of lane name patterns")
    return TenantPolicy(
        weight=float(weight),
        max_running=_count(table.get("max_running"), f"{where} max_running"),
        max_queued=_count(table.get("max_queued"), f"{where} max_queued"),
        priority=priority,
        lanes=tuple(lanes),
        paid_jobs_per_day=_count(table.get("paid_jobs_per_day"), f"{where} paid_jobs_per_day"),
        spend_per_day=_dollars(table.get("spend_per_day"), f"{where} spend_per_day"),
    )


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_COUNT}")
    return value


def _dollars(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of US dollars")
    if math.isnan(value) or not 0 <= value <= MAX_DOLLARS:
        raise ValueError(f"{what} must be from 0 to {MAX_DOLLARS:g} (US dollars)")
    return float(value)


def _duration(value: Any, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        seconds = float(value) if isinstance(value, int | float) else parse_duration(str(value))
    except ValueError:
        raise ValueError(f"{what} must be a duration such as 60s or 5m") from None
    if not 1.0 <= seconds <= 7 * 86400 or math.isnan(seconds):
        raise ValueError(f"{what} must be between 1 s and 7 days")
    return seconds
