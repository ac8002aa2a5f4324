"""A tenant's lane filter (`[tenants.NAME] lanes`): its jobs run only on the lanes it
names, claimed or handed to an idle slot at submit; other tenants use every lane."""

from __future__ import annotations

import asyncio
from pathlib import Path

from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.shares.policy import SharePolicy, TenantPolicy
from comfyfleet.store.sqlite import SQLiteStore

PROMPT = {
    "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
    "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": 0.05}},
    "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
}


async def test_a_tenants_jobs_run_only_on_its_lanes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    hub = Hub()
    lanes = [LocalLane(engine, 2, name="gpu-a"), LocalLane(engine, 2, name="cpu")]
    policy = SharePolicy({"alice": TenantPolicy(lanes=("gpu-*",))})
    scheduler = Scheduler(
        store, lanes, ClientRouter(hub, StatusBroadcaster(hub)), shares=policy, tenants=True
    )
    await scheduler.start()
    try:
        ids = {f"a{n}": "alice" for n in range(10)} | {f"b{n}": "bob" for n in range(10)}
        for number, (prompt_id, tenant) in enumerate(ids.items()):
            await scheduler.submit(
                NewJob(prompt_id, number, False, PROMPT, {}, ["3"], tenant=tenant)
            )
        for _ in range(1000):
            jobs = {p: await store.get(p) for p in ids}
            if all(j is not None and j.status is JobStatus.SUCCESS for j in jobs.values()):
                break
            await asyncio.sleep(0.01)
        lanes_of = {
            t: {j.lane for p, j in jobs.items() if j and ids[p] == t} for t in ("alice", "bob")
        }
        assert lanes_of["alice"] == {"gpu-a"}
        assert lanes_of["bob"] == {"gpu-a", "cpu"}
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()
        engine.close()
