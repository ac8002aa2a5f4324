"""A job given back from a lane leaves it to the others that can run it, also after a
restart (the reasons are in the store)."""

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
from comfyfleet.store.sqlite import SQLiteStore
from tests.unit.store.stores import claim_next

PROMPT = {
    "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}},
    "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": 0.05}},
    "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
}


async def test_jobs_given_back_before_a_restart_still_leave_that_lane(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    ids = [f"p{i}" for i in range(4)]
    for number, prompt_id in enumerate(ids):
        await store.submit(NewJob(prompt_id, number, False, PROMPT, {}, ["3"]))
        job = await claim_next(store, "a", only=prompt_id)
        assert job is not None
        reason = {"kind": "lane", "lane": "a", "error": "backend lost"}
        assert await store.requeue(job.prompt_id, job.attempt, reason)
    await store.close()

    # A new process: the same store, lane "a" free with two slots, "b" with one.
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    hub = Hub()
    lanes = [LocalLane(engine, 2, name="a"), LocalLane(engine, 1, name="b")]
    scheduler = Scheduler(store, lanes, ClientRouter(hub, StatusBroadcaster(hub)))
    await scheduler.start()
    try:
        for _ in range(500):
            jobs = [await store.get(p) for p in ids]
            if all(j is not None and j.status is JobStatus.SUCCESS for j in jobs):
                break
            await asyncio.sleep(0.01)
        assert [(j.lane, j.attempt) for j in jobs if j] == [("b", 2)] * 4
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()
        engine.close()
