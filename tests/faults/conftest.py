"""Fault injection: processes killed and stopped, disks filled, providers misbehaving,
clients that stall or vanish. Every test here carries the `faults` marker.

Fixtures come from the suites that own them: `make_fleet` (dedicated backend processes
and a gateway) from the fleet suite, `make_rig` (an engine with the fan-out service on a
real journal) from the fan-out suite. No shared backend pool is used here: these tests
kill and stop backends.
"""

from __future__ import annotations

from tests.integration.fanout.conftest import make_rig, nodes
from tests.integration.fleet.conftest import backend_pool, make_fleet

__all__ = ["backend_pool", "make_fleet", "make_rig", "nodes"]
