"""The gateways sharing one store: who they are, and how long their lease holds.

A gateway's lease covers every job it runs: it renews the lease by heartbeat, and once
the lease has run out another gateway may take those jobs over (see
`comfyfleet.scheduler.leases`). The attempt number fences what the old owner may still
write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: A gateway id: what `--gateway-id` accepts and what the data dir's file may hold.
GATEWAY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: How long a gateway's lease holds without a heartbeat, by default (s).
DEFAULT_LEASE = 10.0


@dataclass(frozen=True)
class GatewayRecord:
    """A gateway as the store knows it."""

    id: str
    instance: str  # this process: a restart with the same id is a new instance
    host: str
    pid: int
    url: str  # where it serves (as configured: host and port)
    started_at: float
    seen_at: float = 0.0  # its last heartbeat
    lease_until: float = 0.0
    running: int = 0  # jobs it runs now (filled in by `gateways()`)


def next_look(me: str, live: Sequence[GatewayRecord], lease: float, now: float) -> float:
    """Seconds until this gateway looks again for what gone gateways left: its renewal
    beat (a third of its lease), or just after the soonest of the others' leases runs
    out, so a gateway that died is taken over at its lease's end, not up to a beat later."""
    beat = lease / 3
    ends = [g.lease_until - now for g in live if g.id != me]
    soonest = min(ends, default=beat) + LOOK_AFTER_EXPIRY
    return max(MIN_LOOK, min(beat, soonest))


#: How long after another gateway's lease ends it is looked at (clocks and commits).
LOOK_AFTER_EXPIRY = 0.1
#: The shortest wait between looks (a lease in the past does not make a busy loop).
MIN_LOOK = 0.05


@dataclass(frozen=True)
class BackendOwner:
    """A ComfyUI backend as the gateways sharing a store hold it: one live gateway at a
    time connects to it and dispatches to it (see `comfyfleet.server.backend_owners`)."""

    backend: str  # its name (the same in every gateway's config)
    client_id: str  # the ComfyUI clientId every owner uses with it, fleet-wide
    owner: str | None  # the live gateway that holds it; None: free
    since: float  # when its owner claimed it
