"""Every managed backend of a gateway: planned with the fleet, started with the
scheduler, stopped with the gateway."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from comfyfleet.folders import UnsafePath
from comfyfleet.lanes.fleet import Fleet, parse_spec
from comfyfleet.managed.instance import Hooks, ManagedInstance
from comfyfleet.managed.pack import has_pack, pack_paths
from comfyfleet.managed.spec import InstanceSpec, ManagedGroup, plan, visible_gpus
from comfyfleet.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


class ManagedBackends:
    def __init__(self, root: Path, fleet: Fleet, instances: Sequence[ManagedInstance]) -> None:
        self.root = root  # DATA/managed: the instances' folders, the pack
        self.fleet = fleet
        self.instances = {instance.name: instance for instance in instances}
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def create(
        cls, groups: Sequence[ManagedGroup], data_dir: Path, fleet: Fleet, avoid_ports: set[int]
    ) -> ManagedBackends:
        """Plan every instance (GPU, port, folder) and give each a lane of `fleet`."""
        root = (data_dir / "managed").resolve()
        gpus: list[str] = []
        if any(group.gpus is None for group in groups):
            gpus = visible_gpus(os.environ)
            log.info("GPUs found for managed backends: %s", ", ".join(gpus) or "none (CPU)")
        specs = plan(groups, root, gpus_found=gpus, avoid=avoid_ports)
        instances = [
            ManagedInstance(spec, fleet.backend_lane(parse_spec(spec.backend()))) for spec in specs
        ]
        return cls(root, fleet, instances)

    def status(self, name: str) -> dict[str, Any] | None:
        instance = self.instances.get(name)
        return None if instance is None else instance.status()

    async def start(self, scheduler: Scheduler) -> None:
        """Start every process at once; each lane takes work as soon as its process answers."""
        if not self.instances:
            return
        for instance in self.instances.values():
            await instance.recall()
        await self.fleet.rebuild()  # their classes validate before they answer
        paths = None
        if any(_wants_pack(instance.spec) for instance in self.instances.values()):
            try:
                paths = await asyncio.to_thread(pack_paths, self.root)
            except (OSError, UnsafePath) as exc:  # they run, validated from object_info
                log.warning("managed backends get no companion pack: %s", exc)
        self._session = aiohttp.ClientSession()
        for instance in self.instances.values():
            hooks = Hooks(
                self._session,
                busy=lambda lane: bool(scheduler.runs_on(lane)),
                wake=scheduler.wake,
                pack_paths=paths if _wants_pack(instance.spec) else None,
            )
            await instance.start(hooks)

    async def remove(self, name: str) -> None:
        """Stop one instance for good (until the gateway starts again)."""
        instance = self.instances.pop(name, None)
        if instance is not None:
            await instance.stop()

    async def stop(self) -> None:
        """Stop every process (in parallel): once the scheduler is done with them."""
        await asyncio.gather(*(instance.stop() for instance in self.instances.values()))
        if self._session is not None:
            await self._session.close()
            self._session = None


def _wants_pack(spec: InstanceSpec) -> bool:
    """ComfyUI's main.py without the pack in its own custom_nodes, or a command that
    names the pack's paths file."""
    group = spec.group
    if group.runs_comfyui:
        return group.path is not None and not has_pack(group.path)
    return any("{pack_paths}" in part for part in group.command)
