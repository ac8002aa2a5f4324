"""The observer seam: what the scheduler tells its observers, in what order, and that
one failing observer costs nothing to the job or to the other observers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob
from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.store.sqlite import SQLiteStore
from tests.unit.scheduler.test_handoff import sleep_prompt


class Recorder(JobObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.ended = asyncio.Event()

    def job_submitted(self, job: Job) -> None:
        self.calls.append(("submitted", job.prompt_id))

    def job_started(self, job: Job) -> None:
        self.calls.append(("started", (job.lane, job.attempt)))

    def job_event(self, job: Job, event: EngineEvent) -> None:
        if isinstance(event, Message):
            self.calls.append(("event", event.type))

    def job_requeued(self, job: Job, reason: dict[str, Any] | None) -> None:
        self.calls.append(("requeued", reason))

    def job_finished(self, job: Job, result: JobResult) -> None:
        self.calls.append(("finished", result.status))
        self.ended.set()

    def job_stopped(self, job: Job) -> None:
        self.calls.append(("stopped", job.prompt_id))
        self.ended.set()


class Broken(JobObserver):
    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, *_args: Any) -> None:
        self.calls += 1
        raise RuntimeError("an observer's own bug")

    job_submitted = job_started = job_event = job_finished = _fail  # type: ignore[assignment]


async def run_one(tmp_path: Path, seconds: float, *, stop_after: float | None = None) -> Recorder:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "data"))
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    broken, recorder = Broken(), Recorder()
    scheduler = Scheduler(store, [LocalLane(engine, 1)], broken)
    scheduler.observers.add(recorder)
    await scheduler.start()
    try:
        new = NewJob(str(uuid.uuid4()), 0, False, sleep_prompt(seconds, 1), {}, ["3"])
        await scheduler.submit(new)
        if stop_after is None:
            await asyncio.wait_for(recorder.ended.wait(), 10)
            assert broken.calls > 3  # it was called, and failed, every time
        else:
            await asyncio.sleep(stop_after)
    finally:
        await scheduler.stop(grace=0.0)
        await store.close()
        engine.close()
    return recorder


async def test_observers_see_a_job_from_submit_to_its_recorded_end(tmp_path: Path) -> None:
    recorder = await run_one(tmp_path, 0.0)
    kinds = [kind for kind, _ in recorder.calls]
    assert kinds[:2] == ["submitted", "started"]
    assert recorder.calls[1] == ("started", ("local", 1))
    assert recorder.calls[2] == ("event", "execution_start")
    assert recorder.calls[-2:] == [("event", "execution_success"), ("finished", JobStatus.SUCCESS)]
    assert "requeued" not in kinds and "stopped" not in kinds


async def test_a_job_given_back_at_shutdown_is_requeued_then_stopped(tmp_path: Path) -> None:
    recorder = await run_one(tmp_path, 5.0, stop_after=0.3)
    kinds = [kind for kind, _ in recorder.calls]
    assert kinds[:2] == ["submitted", "started"]
    assert ("requeued", None) in recorder.calls
    assert kinds.index("requeued") < kinds.index("stopped")
    assert "finished" not in kinds
