"""Slots claim with data: they read candidates, choose on the event loop and take the
one chosen with a fenced claim. Two gateways on one store race for the same candidates:
the loser of each race moves on, and every job runs once."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
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


def prompt(tag: int, seconds: float = 0.01) -> dict[str, object]:
    return {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": tag}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@contextlib.asynccontextmanager
async def gateway(
    path: Path, engine: Engine, name: str, slots: int = 4
) -> AsyncIterator[Scheduler]:
    store = SQLiteStore(path, owner=name)
    await store.open()
    await store.join(GatewayRecord(name, name, "localhost", os.getpid(), "", 1.0), 10.0)
    hub = Hub()
    lane = LocalLane(engine, slots, name=f"{name}-local")
    scheduler = Scheduler(store, [lane], ClientRouter(hub, StatusBroadcaster(hub)))
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()


async def test_two_gateways_racing_for_candidates_run_every_job_once(tmp_path: Path) -> None:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    path = tmp_path / "jobs.db"
    ids = [f"p{i:03}" for i in range(120)]
    try:
        async with gateway(path, engine, "a") as a, gateway(path, engine, "b") as b:
            for number, prompt_id in enumerate(ids):  # both gateways' slots are woken
                scheduler = (a, b)[number % 2]
                await scheduler.submit(NewJob(prompt_id, number, False, prompt(number), {}, ["3"]))
            for _ in range(1000):
                jobs = [await a.store.get(p) for p in ids]
                if all(j is not None and j.status is JobStatus.SUCCESS for j in jobs):
                    break
                await asyncio.sleep(0.02)
        assert all(j is not None and j.status is JobStatus.SUCCESS for j in jobs)
        ran = {j.prompt_id: (j.attempt, j.owner) for j in jobs if j is not None}
        assert {attempt for attempt, _ in ran.values()} == {1}  # none claimed twice
        assert len(ran) == len(ids)
        assert {owner for _, owner in ran.values()} == {"a", "b"}  # both claimed some
    finally:
        engine.close()


async def test_a_job_queued_ahead_of_the_kept_candidates_goes_first(tmp_path: Path) -> None:
    """Slots keep the page of candidates they read for the next claims; a job queued ahead
    of it (front) is still the next one started."""
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    try:
        async with gateway(tmp_path / "jobs.db", engine, "a", slots=1) as scheduler:
            store = scheduler.store
            for number in range(6):
                new = NewJob(f"p{number}", number, False, prompt(number, 0.1), {}, ["3"])
                await scheduler.submit(new)
            while (p1 := await store.get("p1")) is None or p1.status is not JobStatus.RUNNING:
                await asyncio.sleep(0.01)  # read the queue (p1..p5), and took p1
            await scheduler.submit(NewJob("front", 99, True, prompt(99, 0.0), {}, ["3"]))
            while (p2 := await store.get("p2")) is None or p2.status is JobStatus.PENDING:
                await asyncio.sleep(0.01)
            front = await store.get("front")
            assert front is not None and front.started_at is not None
            assert p2.started_at is not None and front.started_at <= p2.started_at
    finally:
        engine.close()
