"""A prompt submitted while a slot waits for work goes straight to that slot.

The store queues it as already claimed (one transaction, not queue-then-claim)
and the parked slot runs it, also when several arrive at once while as many slots
wait; queued work is never overtaken by a hand-off, a hand-off can be
cancelled like any running job, and a job handed over just as its lane retires
(or the scheduler stops) still runs to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.jobs import Job, JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.store.sqlite import SQLiteStore


def sleep_prompt(seconds: float, tag: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": tag}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@dataclass
class Setup:
    scheduler: Scheduler
    store: SQLiteStore

    async def submit(self, seconds: float, tag: int) -> str:
        prompt_id = str(uuid.uuid4())
        number = await self.store.next_number()
        new = NewJob(prompt_id, number, False, sleep_prompt(seconds, tag), {}, ["3"])
        await self.scheduler.submit(new)
        return prompt_id

    async def ended(self, prompt_id: str, timeout: float = 10.0) -> Job:
        for _ in range(int(timeout / 0.01)):
            job = await self.store.get(prompt_id)
            if job is not None and job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
                return job
            await asyncio.sleep(0.01)
        raise AssertionError(f"{prompt_id} did not end")

    async def parked(self) -> None:
        """Until the slot waits for work (it parks once it found nothing to claim)."""
        for _ in range(500):
            if self.scheduler.queue_remaining == 0 and self.scheduler.waiting_slots:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the slot never went idle")


@contextlib.asynccontextmanager
async def running(tmp_path: Path, slots: int) -> AsyncIterator[Setup]:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    hub = Hub()
    lane = LocalLane(engine, slots)
    scheduler = Scheduler(store, [lane], ClientRouter(hub, StatusBroadcaster(hub)))
    await scheduler.start()
    try:
        yield Setup(scheduler, store)
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()
        engine.close()


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with running(tmp_path, 1) as one_slot:
        yield one_slot


async def test_an_idle_slot_gets_the_job_with_one_commit_to_start_it(setup: Setup) -> None:
    await setup.parked()
    before = setup.store.stats.transactions
    prompt_id = await setup.submit(0.0, 1)
    job = await setup.ended(prompt_id)
    assert (job.status, job.attempt, job.lane) == (JobStatus.SUCCESS, 1, "local")
    # Queued-and-claimed in one transaction, then the end: two in all. Queueing and
    # claiming apart would take three.
    assert setup.store.stats.transactions - before == 2


async def test_queued_work_runs_first_and_in_order(setup: Setup) -> None:
    await setup.parked()
    first = await setup.submit(0.3, 0)  # handed over: the slot is busy from here on
    queued = [await setup.submit(0.0, tag) for tag in range(1, 6)]
    for prompt_id in [first, *queued]:
        await setup.ended(prompt_id)
    last = await setup.submit(0.0, 6)  # the slot is idle again: a hand-off
    await setup.ended(last)
    starts: list[float] = []
    for prompt_id in [first, *queued, last]:
        record = await setup.store.get(prompt_id)
        assert record is not None and record.started_at is not None
        starts.append(record.started_at)
    assert starts == sorted(starts)


async def test_concurrent_submits_all_go_straight_to_waiting_slots(tmp_path: Path) -> None:
    async with running(tmp_path, 4) as setup:
        for _ in range(500):  # every slot parked
            if setup.scheduler.waiting_slots == 4:
                break
            await asyncio.sleep(0.01)
        before = setup.store.stats.operations
        ids = await asyncio.gather(*(setup.submit(0.2, tag) for tag in range(4)))
        assert {job.prompt_id for job in setup.scheduler.running_jobs()} == set(
            ids
        )  # running at once, none queued
        jobs = [await setup.ended(prompt_id) for prompt_id in ids]
        assert {job.status for job in jobs} == {JobStatus.SUCCESS}
        # Each job: queued-and-claimed in one operation, then its end. A claim apart
        # would add one operation per job.
        assert setup.store.stats.operations - before == 8


async def test_a_job_handed_over_can_be_cancelled(setup: Setup) -> None:
    await setup.parked()
    prompt_id = await setup.submit(30.0, 1)
    assert setup.scheduler.running_job(prompt_id) is not None  # counted and cancellable at once
    assert await setup.scheduler.cancel([prompt_id]) == [prompt_id]
    job = await setup.ended(prompt_id)
    assert job.status == JobStatus.CANCELLED


@pytest.mark.parametrize("ending", ["remove the lane", "stop the scheduler"])
async def test_a_job_handed_over_as_its_slot_winds_down_runs_to_its_end(
    setup: Setup, ending: str
) -> None:
    await setup.parked()
    # The submit has started the job for the parked slot, whose task has not woken yet:
    # winding down now must let that job finish, not cancel the slot as idle.
    prompt_id = await setup.submit(0.2, 1)
    # Awaited directly: no loop pass between the hand-off and the wind-down.
    if ending == "remove the lane":
        await setup.scheduler.remove_lane("local")
    else:
        await setup.scheduler.stop(grace=5.0)
    job = await setup.store.get(prompt_id)
    assert job is not None
    assert (job.status, job.attempt) == (JobStatus.SUCCESS, 1)
    assert setup.scheduler.running_job(prompt_id) is None
