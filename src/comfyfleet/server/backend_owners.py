"""Which ComfyUI backends this gateway dispatches to, when several share one store.

Each backend (by name) is dispatched by one gateway at a time: the one that owns it in
the store (`BackendOwners`), for as long as that gateway's lease holds. A gateway adds
a lane (connects, sends prompts) only for the backends it owns; of the others it only
reads what they can run, so it still validates and accepts prompts for them. At start
and on every lease tick it claims free backends (a dead gateway's among them), then
takes over what was left running there: the prompts are adopted and followed.

Spread, kept simple: while another live gateway owns no backend, a gateway claims no
more than its fair share, ceil(backends / live gateways), and gives back what it holds
beyond that (its lane drains first: no new work, running prompts end there). Otherwise
it claims every free backend, so none is left without a gateway.

Every owner of a backend connects with the backend's one client id, kept in the store:
ComfyUI sends a prompt's frames to the clientId socket it was queued with, so a new
owner receives the frames of what the old one sent there. Managed backends
([[comfyui]]) are this gateway's own processes: always its own, never in the table.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection

from comfyfleet.domain.backend_names import FleetError
from comfyfleet.domain.gateways import next_look
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.lanes.fleet import Fleet, parse_spec
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.store.base import JobStore, StoreError

log = logging.getLogger(__name__)


class BackendOwnership:
    def __init__(
        self,
        store: JobStore,
        fleet: Fleet,
        scheduler: Scheduler,
        *,
        configured: Collection[str],
        pinned: Collection[str],
        lease: float,
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.scheduler = scheduler
        self.configured = frozenset(configured)  # from the config: not the store's to remove
        self.pinned = frozenset(pinned)  # managed backends: always this gateway's
        self.lease = lease
        self.owned: set[str] = set()  # shared backends whose lanes run here
        self.owners: dict[str, str | None] = {}  # every shared backend's owner, last read
        self._leaving: dict[str, asyncio.Task[None]] = {}  # lanes winding down here
        self._lock = asyncio.Lock()  # one tick at a time (the loop's, an admin request's)
        self._loop: asyncio.Task[None] | None = None

    def pin(self, name: str) -> None:
        """A lane only this gateway can reach (a worker connected here): always its own."""
        self.pinned = self.pinned | {name}

    def unpin(self, name: str) -> None:
        self.pinned = self.pinned - {name}

    def shared(self) -> list[str]:
        return [name for name in self.fleet.backends if name not in self.pinned]

    def owns(self, name: str) -> bool:
        return name in self.pinned or name in self.owned

    def owner_of(self, name: str) -> str | None:
        return self.store.owner if self.owns(name) else self.owners.get(name)

    async def claim_at_start(self) -> set[str]:
        """Claim before the scheduler starts; the names of every backend to include."""
        async with self._lock:
            held = await self._claim()
            for name in held:
                lane = self.fleet.backends[name]
                lane.connect_as(held[name])
                self.owned.add(name)
        return self.owned | (self.pinned & set(self.fleet.backends))

    async def start(self) -> None:
        """Observe the backends others own, and renew the claims on every lease tick."""
        for name in self.shared():
            if name not in self.owned:
                self.fleet.backends[name].observe()
        self._loop = asyncio.create_task(self._run(), name="backend-owners")

    async def stop(self) -> None:
        """Stop claiming (before the scheduler stops); `release` once it has."""
        tasks = list(self._leaving.values())
        if self._loop is not None:
            tasks.append(self._loop)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def release(self) -> None:
        """Free every backend this gateway owns (a clean stop: nothing runs there now)."""
        await self.store.release_backends()
        self.owned.clear()

    async def forget(self, name: str) -> None:
        """A backend removed at run time (its lane already gone from the scheduler)."""
        async with self._lock:
            self.owned.discard(name)
            self.owners.pop(name, None)
            lane = self.fleet.backends.get(name)
            if lane is not None:
                await lane.stop_observing()

    async def _run(self) -> None:
        wait = self.lease / 3
        while True:
            await asyncio.sleep(wait)
            wait = self.lease / 3
            try:
                await self.tick()
                live = await self.store.gateways()
                # A dead owner's backends are free once its lease ends: look just then.
                wait = next_look(self.store.owner, live, self.lease, time.time())
            except StoreError as exc:
                log.warning("could not renew backend ownership: %s", exc)

    async def tick(self) -> None:
        """Follow the store's backends, claim free ones, let go of lost ones."""
        async with self._lock:
            await self._follow_store()
            held = await self._claim()
            for name in sorted(self.owned - set(held) - set(self._leaving)):
                log.warning("backend %s is another gateway's now: letting it go", name)
                self._wind_down(name, release=False)
            gained = [name for name in held if name not in self.owned]
            for name in gained:
                await self._take(self.fleet.backends[name], held[name])
            if gained:
                await self.scheduler.take_over_orphans()
            await self._give_back_excess()
            self.owners = {o.backend: o.owner for o in await self.store.backend_owners()}

    async def _claim(self) -> dict[str, str]:
        """Claim within the fair share; every shared backend owned here -> its client id."""
        offered = {
            name: self.fleet.backends[name].client_id
            for name in self.shared()
            if name not in self._leaving
        }
        limit = await self._room(len(offered))
        # A backend whose gateway's lease ran out is taken only when its jobs may be.
        sweeping = self.scheduler.lease_guard.may_sweep()
        held = await self.store.claim_backends(offered, limit, take_lapsed=sweeping)
        return {owner.backend: owner.client_id for owner in held}

    async def _room(self, backends: int) -> int | None:
        """How many more backends to claim: None (all free ones) unless another live
        gateway owns none; then what this one lacks of its fair share."""
        share, mine, idle = await self._share(backends)
        return None if not idle else max(0, share - mine)

    async def _share(self, backends: int) -> tuple[int, int, bool]:
        """(fair share, backends owned here, whether another live gateway owns none)."""
        live = [g.id for g in await self.store.gateways()]
        owners = await self.store.backend_owners()
        owning = {o.owner for o in owners if o.owner is not None}
        idle = any(g not in owning and g != self.store.owner for g in live)
        share = math.ceil(backends / max(1, len(live)))
        mine = sum(1 for o in owners if o.owner == self.store.owner)
        return share, mine, idle

    async def _give_back_excess(self) -> None:
        share, mine, idle = await self._share(len(self.shared()))
        if not idle or mine - len(self._leaving) <= share:
            return
        keep = sorted(self.owned - set(self._leaving))
        # The least busy go first: they drain soonest.
        keep.sort(key=lambda name: len(self.scheduler.runs_on(self.fleet.backends[name].name)))
        for name in keep[: mine - len(self._leaving) - share]:
            log.info("backend %s: giving it back to spread the backends", name)
            self._wind_down(name, release=True)

    async def _take(self, lane: ComfyUILane, client_id: str) -> None:
        await lane.stop_observing()
        lane.connect_as(client_id)  # the fleet's, whoever connected before
        await self.scheduler.add_lane(lane)
        self.owned.add(lane.spec.name)
        log.info("backend %s: this gateway dispatches to it now", lane.spec.name)

    def _wind_down(self, name: str, *, release: bool) -> None:
        """Take no new work there; once what runs there has ended, let it go. Nothing is
        interrupted: a lost backend's prompts are another gateway's to follow now."""
        if name in self._leaving:
            return
        lane = self.fleet.backends[name]

        async def leave() -> None:
            try:
                await self.scheduler.remove_lane(lane.name)
                if release:
                    await self.store.release_backends([name])
            finally:
                self.owned.discard(name)
                self._leaving.pop(name, None)
            if name in self.fleet.backends:
                lane.observe()

        self._leaving[name] = asyncio.create_task(leave(), name=f"leave-{name}")

    async def _follow_store(self) -> None:
        """Backends added at run time (through any gateway) get a lane here; those
        removed lose theirs."""
        stored = {}
        for raw in await self.store.backends():
            try:
                spec = parse_spec(raw)
            except FleetError as exc:
                log.warning("a stored backend is left out: %s", exc)
                continue
            stored[spec.name] = spec
        for name, spec in stored.items():
            if name not in self.fleet.backends and name not in self._leaving:
                self.fleet.backend_lane(spec).observe()
        for name in self.shared():
            if name in stored or name in self.configured or name in self._leaving:
                continue
            lane = self.fleet.backends[name]
            if name in self.owned:
                await self.scheduler.remove_lane(lane.name, timeout=30.0)
                self.owned.discard(name)
            await lane.close()
            await self.fleet.forget(name)
            log.info("backend %s was removed", name)
