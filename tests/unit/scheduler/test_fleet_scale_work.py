"""The work a dispatch costs does not grow with the fleet: counted, not timed. A job that
arrives while hundreds of lanes are busy starts one reservation, not one per lane, and
a queue of them is set aside a few at a time, to the end; a prompt submitted while many
lanes are idle and none is warm for it goes to the first that can start it, without
asking each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.candidates import Candidates
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.reservations import RESERVING, Reservations
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.scheduler.slots import LaneSlots, Slot
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.store.sqlite import SQLiteStore

LANES = 300


class CountingLane(LocalLane):
    """A local lane that counts how often the scheduler asks whether it can run a job."""

    asked = 0

    def can_run(self, job: object) -> bool:
        CountingLane.asked += 1
        return True


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[SchedulerState]:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    scheduler_state = SchedulerState(store, Observers(), [])
    for n in range(LANES):
        scheduler_state.add_lane(LaneSlots(CountingLane(engine, 1, name=f"lane{n}")))
    yield scheduler_state
    await store.close()
    engine.close()


def job(prompt_id: str) -> NewJob:
    prompt = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}}
    return NewJob(prompt_id, 1, False, prompt, {}, ["1"])


async def test_a_job_arriving_while_every_lane_is_busy_starts_one_reservation(
    state: SchedulerState,
) -> None:
    reservations = Reservations(state, Candidates(state))
    for entry in state.lanes.values():  # busy, its backend holding the prompt
        state.taken(entry)
        state.accept(entry, Slot())
    await state.store.submit(job("p"))
    state.pending = 1
    reservations.reserve_ahead()
    started = [t for t in asyncio.all_tasks() if t.get_name().startswith("reserve-")]
    assert len(started) == 1
    await asyncio.gather(*started)
    assert [r.job.prompt_id for r in state.reserved.in_order()] == ["p"]


async def test_busy_lanes_set_the_queue_aside_a_few_reservations_at_a_time(
    state: SchedulerState,
) -> None:
    """Forty jobs wait while every lane is busy: RESERVING looks at once, each that
    found one starting the next, until every job is set aside."""
    reservations = Reservations(state, Candidates(state))
    for entry in state.lanes.values():
        state.taken(entry)
        state.accept(entry, Slot())
    for n in range(40):
        await state.store.submit(job(f"p{n}"))
    state.pending = 40
    reservations.reserve_ahead()
    at_once = [t for t in asyncio.all_tasks() if t.get_name().startswith("reserve-")]
    assert len(at_once) == RESERVING
    async with asyncio.timeout(10):
        while len(state.reserved) < 40:
            await asyncio.sleep(0.01)
    owners = {r.owner for r in state.reserved.in_order()}
    assert len(owners) == 40  # one each, for forty lanes


async def test_a_prompt_for_idle_cold_lanes_goes_to_the_first_without_a_scan(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    lanes = [CountingLane(engine, 1, name=f"lane{n}") for n in range(LANES)]
    hub = Hub()
    scheduler = Scheduler(store, lanes, ClientRouter(hub, StatusBroadcaster(hub)))
    await scheduler.start()
    try:
        await asyncio.sleep(0.5)  # every slot found nothing to claim: parked
        CountingLane.asked = 0
        await scheduler.submit(job("p"))
        assert CountingLane.asked <= 3  # the lane chosen, not each of the 300
        async with asyncio.timeout(10):
            while (done := await store.get("p")) is None or done.status is not JobStatus.SUCCESS:
                await asyncio.sleep(0.02)
    finally:
        await scheduler.stop(grace=1.0)
        await store.close()
        engine.close()
