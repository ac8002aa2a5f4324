"""`Scheduler.take_over_orphans` takes over now what a gateway whose lease ran out left,
as the lease keeper's tick does: its run on a lane this gateway has is re-queued here
and runs again."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.store.sqlite import SQLiteStore
from tests.unit.store.stores import Clock, claim_next

PROMPT = {
    "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
    "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
}
LEASE = 10.0


def record(name: str) -> GatewayRecord:
    return GatewayRecord(name, name, "localhost", os.getpid(), "", 1.0)


async def test_a_dead_gateways_run_is_taken_over_and_runs_here(tmp_path: Path) -> None:
    clock = Clock()
    dead = SQLiteStore(tmp_path / "jobs.db", clock=clock, owner="dead")
    here = SQLiteStore(tmp_path / "jobs.db", clock=clock, owner="here")
    await dead.open()
    await here.open()
    await dead.join(record("dead"), LEASE)
    await here.join(record("here"), LEASE)
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    hub = Hub()
    lane = LocalLane(engine, 1, name="local")
    scheduler = Scheduler(here, [lane], ClientRouter(hub, StatusBroadcaster(hub)), lease=LEASE)
    await scheduler.start()
    try:
        await dead.submit(NewJob("p1", 1, False, PROMPT, {}, ["3"]))
        taken = await claim_next(dead, "local")  # then the gateway dies mid-run
        assert taken is not None and taken.attempt == 1
        await scheduler.take_over_orphans()
        assert (await here.get("p1")).status is JobStatus.RUNNING  # type: ignore[union-attr]
        clock.advance(LEASE + 1)
        await here.heartbeat(LEASE)
        await scheduler.take_over_orphans()
        for _ in range(300):
            job = await here.get("p1")
            if job is not None and job.status is JobStatus.SUCCESS:
                break
            await asyncio.sleep(0.01)
        assert job is not None and (job.status, job.attempt, job.owner) == (
            JobStatus.SUCCESS,
            2,
            "here",
        )
    finally:
        await scheduler.stop(grace=1.0)
        await dead.close()
        await here.close()
        engine.close()
