"""The nemesis: a schedule of faults drawn from a seed, injected one after another while
the workload runs. It only breaks things; what went wrong is the checker's to say.

Faults (the time each lasts is drawn too, always past what the system waits for):
- kill-gateway: SIGKILL a gateway, start it again (same id, port, data dir) 0.5-3 s later
- pause-gateway: SIGSTOP a gateway for 1.5-3 leases, then SIGCONT
- pg-restart: PostgreSQL stopped in immediate mode (a crash) and started at once
- pg-outage: PostgreSQL stopped (immediate) for 1.5-2.5 leases, then started
- pg-freeze: SIGSTOP of the postmaster and its children for 1.5-2.5 leases, then SIGCONT
- kill-backend: SIGKILL a backend, start it again 0.5-3 s later
- pause-backend: SIGSTOP a backend for the hang timeout plus 1-3 s, then SIGCONT
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass

from cluster import Cluster

KINDS = (
    "kill-gateway",
    "pause-gateway",
    "pg-restart",
    "pg-outage",
    "pg-freeze",
    "kill-backend",
    "pause-backend",
)


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str  # g1, b2, comfyui, postgres
    gap: float  # seconds of calm before it
    hold: float  # seconds it lasts (a pause, an outage) or before the restart (a kill)


@dataclass(frozen=True)
class Injected:
    fault: Fault
    start: float  # seconds after the schedule's start
    end: float
    at: float  # time.time() of its start (what the findings are dated by)

    def describe(self) -> str:
        held = f" {self.fault.hold:.1f}s" if self.fault.kind != "pg-restart" else ""
        where = "" if self.fault.target == "postgres" else f" {self.fault.target}"
        return f"{self.fault.kind}{where}{held} @{self.start:.0f}s"


def plan(
    rng: random.Random,
    kinds: list[str],
    gateways: list[str],
    backends: list[str],
    lease: float,
    hang_timeout: float,
    count: int = 40,
) -> list[Fault]:
    """`count` faults (more than a schedule has time for: it stops when the work is
    done), drawn from `kinds`; backend faults only when there are backends."""
    usable = [k for k in kinds if backends or not k.endswith("-backend")]
    faults = []
    for n in range(count):
        kind = rng.choice(usable)
        gap = rng.uniform(2.0, 5.0) if n == 0 else rng.uniform(1.0, 4.0)
        if kind.endswith("-gateway"):
            target = rng.choice(gateways)
        elif kind.endswith("-backend"):
            target = rng.choice(backends)
        else:
            target = "postgres"
        if kind in ("kill-gateway", "kill-backend"):
            hold = rng.uniform(0.5, 3.0)
        elif kind == "pause-gateway":
            hold = lease * rng.uniform(1.5, 3.0)
        elif kind in ("pg-outage", "pg-freeze"):
            hold = lease * rng.uniform(1.5, 2.5)
        elif kind == "pause-backend":
            hold = hang_timeout + rng.uniform(1.0, 3.0)
        else:
            hold = 0.0
        faults.append(Fault(kind, target, round(gap, 2), round(hold, 2)))
    return faults


class Nemesis:
    def __init__(self, cluster: Cluster, faults: list[Fault], began: float) -> None:
        self.cluster = cluster
        self.faults = faults
        self.began = began  # time.monotonic() of the schedule's start
        self.injected: list[Injected] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Inject the faults in turn until `stop` is set (checked between faults)."""
        for fault in self.faults:
            try:
                await asyncio.wait_for(stop.wait(), fault.gap)
                return
            except TimeoutError:
                pass
            start, at = time.monotonic() - self.began, time.time()
            await self.inject(fault)
            self.injected.append(Injected(fault, start, time.monotonic() - self.began, at))

    async def inject(self, fault: Fault) -> None:
        cluster, pg = self.cluster, self.cluster.pg
        if fault.kind in ("kill-gateway", "kill-backend"):
            server = cluster.servers()[fault.target]
            await server.kill()
            await asyncio.sleep(fault.hold)
            await server.start()
        elif fault.kind in ("pause-gateway", "pause-backend"):
            server = cluster.servers()[fault.target]
            server.send(signal.SIGSTOP)
            await asyncio.sleep(fault.hold)
            server.send(signal.SIGCONT)
        elif fault.kind == "pg-restart":
            await asyncio.to_thread(pg.stop)
            await asyncio.to_thread(pg.start)
        elif fault.kind == "pg-outage":
            await asyncio.to_thread(pg.stop)
            await asyncio.sleep(fault.hold)
            await asyncio.to_thread(pg.start)
        elif fault.kind == "pg-freeze":
            pg.freeze()
            await asyncio.sleep(fault.hold)
            pg.thaw()
        else:
            raise ValueError(f"unknown fault {fault.kind}")
