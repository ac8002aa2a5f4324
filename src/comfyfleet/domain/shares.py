"""What the store tells the scheduler of each tenant's jobs, for fair share."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class TenantCounts:
    """One tenant's jobs in the store: claimable, running (fleet-wide), and when its
    oldest claimable one was submitted (store time)."""

    pending: int = 0
    running: int = 0
    oldest: float = math.inf
