"""Between two free lanes, the one that last ran the same model files takes the prompt."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from comfyfleet.domain.jobs import Job, JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.affinity import Warmth
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.choosing import Verdict, eligible
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.store.sqlite import SQLiteStore


def prompt(model: str, seconds: float) -> dict[str, Any]:
    """A model file name as a constant input (what affinity looks at), then a Sleep."""
    return {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": model}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


async def run_one(
    scheduler: Scheduler, store: SQLiteStore, model: str, seconds: float = 0.0
) -> str:
    prompt_id = str(uuid.uuid4())
    number = await store.next_number()
    await scheduler.submit(NewJob(prompt_id, number, False, prompt(model, seconds), {}, ["3"]))
    for _ in range(200):
        job = await store.get(prompt_id)
        if job is not None and job.status == JobStatus.SUCCESS:
            assert job.lane is not None
            return job.lane
        await asyncio.sleep(0.02)
    raise AssertionError("the prompt did not finish")


async def test_the_warm_lane_takes_its_models_again(tmp_path: Path) -> None:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    hub = Hub()
    lanes = [LocalLane(engine, 1, name="a"), LocalLane(engine, 1, name="b")]
    scheduler = Scheduler(store, lanes, ClientRouter(hub, StatusBroadcaster(hub)))
    await scheduler.start()
    try:
        # At the same time, so each lane takes one and is then warm for its model.
        first_x, first_y = await asyncio.gather(
            run_one(scheduler, store, "x.safetensors", 0.3),
            run_one(scheduler, store, "y.safetensors", 0.3),
        )
        assert {first_x, first_y} == {"a", "b"}
        # Both free from now on: each model keeps going to the lane that loaded it.
        for _ in range(4):
            assert await run_one(scheduler, store, "x.safetensors") == first_x
            assert await run_one(scheduler, store, "y.safetensors") == first_y
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()
        engine.close()


async def test_a_cold_lane_leaves_the_job_to_a_free_warm_one_but_never_waits(
    tmp_path: Path,
) -> None:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    hub = Hub()
    scheduler = Scheduler(
        store,
        [LocalLane(engine, 1, name="warm"), LocalLane(engine, 1, name="cold")],
        ClientRouter(hub, StatusBroadcaster(hub)),
    )
    try:
        state = scheduler.state
        warm, cold = state.lanes["warm"], state.lanes["cold"]
        state.warmed(warm, Warmth.of(prompt("x.safetensors", 0)))
        job = _job("x.safetensors")
        assert eligible(state, warm, job) is Verdict.TAKE
        # The warm lane is free: leave it there (and wake it).
        assert eligible(state, cold, job) is Verdict.LEAVE
        warm.busy = 1
        assert eligible(state, cold, job) is Verdict.TAKE  # the warm lane is busy: no wait
        warm.busy = 0
        other = _job("y.safetensors")
        assert eligible(state, cold, other) is Verdict.TAKE  # nobody is warmer for y
    finally:
        engine.close()


def _job(model: str) -> Job:
    return Job(
        str(uuid.uuid4()),
        0,
        False,
        0,
        prompt(model, 0),
        {},
        ["3"],
        None,
        JobStatus.PENDING,
        0,
        None,
        0.0,
    )
