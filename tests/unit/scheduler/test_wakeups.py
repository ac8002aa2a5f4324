"""Wake-ups at scale: a new job wakes one parked slot of a lane that can run it (not every
idle slot of the fleet), and slots that look at the queue together share one read."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

from comfyfleet.domain.jobs import Job, JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.candidates import Candidates
from comfyfleet.scheduler.choosing import Verdict
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.slots import Parked, Slot
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.store.sqlite import SQLiteStore


def job(class_type: str) -> Job:
    prompt = {"1": {"class_type": class_type, "inputs": {}}}
    return NewJob(str(uuid.uuid4()), 0, False, prompt, {}, ["1"]).pending(1, 0.0)


class Asked:
    """How many times lanes were asked whether they can run a job."""

    def __init__(self) -> None:
        self.count = 0


def count_can_run(lanes: list[LocalLane]) -> Asked:
    asked = Asked()
    for lane in lanes:
        can_run = lane.can_run

        def counted(job: Job, can_run: Callable[[Job], bool] = can_run) -> bool:
            asked.count += 1
            return can_run(job)

        lane.can_run = counted  # type: ignore[method-assign]
    return asked


async def park_every_slot(state: SchedulerState) -> list[Parked]:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    parked = []
    for entry in state.lanes.values():
        for _ in range(entry.lane.slots):
            parked.append(Parked(Slot(), loop.create_future(), task))
            entry.parked.append(parked[-1])
    return parked


async def test_a_new_job_wakes_one_slot_of_a_lane_that_can_run_it(tmp_path: Path) -> None:
    testing = Engine(build_registry(testing=True), Folders.under(tmp_path / "t"))
    plain = Engine(build_registry(), Folders.under(tmp_path / "p"))
    store = SQLiteStore(tmp_path / "jobs.db")
    lanes = [LocalLane(plain, 2, name=f"plain{k}") for k in range(50)]
    lanes.append(LocalLane(testing, 2, name="testing"))
    state = SchedulerState(store, Observers(), lanes)
    try:
        parked = await park_every_slot(state)
        state.work_arrived(None, job("Sleep"))  # only the testing lane has Sleep
        woken = [p for p in parked if p.started.done()]
        assert len(woken) == 1 and woken[0] in parked[-2:]

        state.work_arrived(None, job("PreviewAny"))  # any lane: the next one in turn
        state.work_arrived(None, job("PreviewAny"))
        woken_at = [i for i, p in enumerate(parked) if p.started.done()]
        assert len(woken_at) == 3 and woken_at[1] // 2 != woken_at[2] // 2  # two lanes

        state.work_arrived(None)  # a job not known here: every slot looks
        assert all(p.started.done() for p in parked)
    finally:
        testing.close()
        plain.close()


async def test_slots_that_look_at_the_queue_together_share_one_read(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    try:
        for k in range(3):
            await store.submit(NewJob(f"p{k}", k, False, {}, {}, []))
        state = SchedulerState(store, Observers(), [])
        candidates = Candidates(state)
        reads = 0
        read = store.candidates

        async def counted(
            limit: int, after: Job | None = None, tenant: str | None = None
        ) -> list[Job]:
            nonlocal reads
            reads += 1
            return await read(limit, after, tenant)

        store.candidates = counted  # type: ignore[method-assign]

        async def claim() -> Job | None:
            found, _ = await candidates.take_first(
                lambda _job: Verdict.TAKE, lambda job: store.claim_job(job, "lane")
            )
            return found

        taken = await asyncio.gather(*(claim() for _ in range(8)))
        assert sorted(j.prompt_id for j in taken if j is not None) == ["p0", "p1", "p2"]
        assert reads <= 2  # one read of the front for all eight (and one past it)
        _, total = await store.jobs(statuses=[JobStatus.RUNNING])
        assert total == 3
    finally:
        await store.close()


async def test_a_slot_picks_its_reservation_asking_few_lanes_whether_they_can_run_it(
    tmp_path: Path,
) -> None:
    from comfyfleet.scheduler.reservations import Reservations
    from comfyfleet.scheduler.slots import Reservation

    plain = Engine(build_registry(), Folders.under(tmp_path / "p"))
    store = SQLiteStore(tmp_path / "jobs.db")
    lanes = [LocalLane(plain, 1, name=f"lane{k}") for k in range(500)]
    state = SchedulerState(store, Observers(), lanes)
    asked = count_can_run(lanes)
    entries = list(state.lanes.values())
    for k, entry in enumerate(entries):  # each lane holds one, in queue order
        reserved = NewJob(f"p{k}", k, False, job("PreviewAny").prompt, {}, ["1"]).pending(k, 0.0)
        state.reserved.add(Reservation(reserved, entry, 0.0))
    try:
        reservations = Reservations(state, Candidates(state))
        chosen = reservations.pick(entries[-1], Slot(last_run=1e9))  # its own: none waited long
        assert chosen is not None and chosen.job.prompt_id == "p499"
        assert asked.count <= 2  # its own, and the earliest other (500 before)
        stolen = reservations.pick(entries[-2], Slot(last_run=0.0))  # others have waited
        assert stolen is not None and stolen.job.prompt_id == "p0"
    finally:
        plain.close()


async def test_at_fleet_scale_a_claim_asks_no_idle_lane_when_none_can_be_warmer(
    tmp_path: Path,
) -> None:
    """A thousand idle lanes: whether a lane takes a job that wants no model (nothing to
    be warmer for) is decided without asking the other lanes whether they could run it."""
    from comfyfleet.scheduler.choosing import eligible

    plain = Engine(build_registry(), Folders.under(tmp_path / "p"))
    store = SQLiteStore(tmp_path / "jobs.db")
    lanes = [LocalLane(plain, 1, name=f"lane{k}") for k in range(1000)]
    state = SchedulerState(store, Observers(), lanes)
    asked = count_can_run(lanes)
    try:
        entry = state.lanes["lane500"]
        assert eligible(state, entry, job("PreviewAny")) is Verdict.TAKE
        assert asked.count <= 2  # its own lane (and the avoidance check's), not a thousand
    finally:
        plain.close()


async def test_reservations_are_found_by_lane_and_by_queue_order(tmp_path: Path) -> None:
    """What a free slot and a new job ask of a thousand reservations costs what they
    find: a lane's own, and those behind a new job (none, for a job at the queue's end)."""
    from comfyfleet.scheduler.reservations import Reservations
    from comfyfleet.scheduler.slots import Reservation

    plain = Engine(build_registry(), Folders.under(tmp_path / "p"))
    store = SQLiteStore(tmp_path / "jobs.db")
    lanes = [LocalLane(plain, 1, name=f"lane{k}") for k in range(1000)]
    state = SchedulerState(store, Observers(), lanes)
    asked = count_can_run(lanes)
    entries = list(state.lanes.values())
    for k, entry in enumerate(entries):
        held = NewJob(f"p{k}", k, False, job("PreviewAny").prompt, {}, ["1"]).pending(k, 0.0)
        state.reserved.add(Reservation(held, entry, 0.0))
    try:
        reservations = Reservations(state, Candidates(state))
        assert reservations.reserved_for("lane7") == ["p7"]
        last = NewJob("late", 5000, False, job("PreviewAny").prompt, {}, ["1"]).pending(5000, 0.0)
        reservations.make_way_for(last)  # at the end of the queue: nothing is behind it
        assert asked.count == 0 and len(state.reserved) == 1000
        early = NewJob("early", 499.5, False, job("PreviewAny").prompt, {}, ["1"]).pending(1, 0.0)
        reservations.make_way_for(early)  # ahead of the last 500: they go back
        assert asked.count == 500
        await asyncio.gather(*state.settling, return_exceptions=True)
        assert len(state.reserved) == 500
        assert [r.job.prompt_id for r in state.reserved.in_order()][:3] == ["p0", "p1", "p2"]
    finally:
        plain.close()
