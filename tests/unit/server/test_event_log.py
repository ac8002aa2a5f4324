"""The event log over a real SQLite store: batched appends, followers that join at any
moment, fall behind or resume, and streams that always end with the done signal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob
from comfyfleet.domain.prompt_events import PromptEvent
from comfyfleet.engine.events import Message, NodeProgress
from comfyfleet.protocol import events
from comfyfleet.server.delivery import event_log as event_log_module
from comfyfleet.server.delivery.event_log import EventLog
from comfyfleet.store.sqlite import SQLiteStore
from tests.unit.store.stores import claim_next

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "jobs.db", synchronous="NORMAL")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def log(store: SQLiteStore) -> AsyncIterator[EventLog]:
    made = EventLog(store, retention=3600, flush_interval=0.005)
    yield made
    await made.close()


async def running_job(store: SQLiteStore, prompt_id: str) -> Job:
    await store.submit(NewJob(prompt_id, 1, False, {}, {}, []))
    job = await claim_next(store, "lane")
    assert job is not None
    return job


def progress(job: Job, value: int) -> Message:
    return Message("progress", {"value": value, "max": 1000, "prompt_id": job.prompt_id})


async def collect(log: EventLog, prompt_id: str, after: int = 0) -> list[PromptEvent]:
    return [event async for event in log.follow(prompt_id, after)]


async def test_a_burst_of_events_is_one_commit(store: SQLiteStore, log: EventLog) -> None:
    job = await running_job(store, "p")
    before = store.stats.transactions
    log.job_started(job)
    for value in range(200):
        log.job_event(job, progress(job, value))
    await log.flush()
    assert store.stats.transactions - before == 1
    assert [e.data["value"] for e in await store.prompt_events("p", limit=1000)] == list(range(200))


async def test_followers_joining_at_any_moment_get_the_whole_stream_once(
    store: SQLiteStore, log: EventLog
) -> None:
    job = await running_job(store, "p")
    log.job_started(job)
    followers: list[asyncio.Task[list[PromptEvent]]] = []
    for value in range(600):
        log.job_event(job, progress(job, value))
        if value % 50 == 0:
            followers.append(asyncio.create_task(collect(log, "p")))
        if value % 7 == 0:
            await asyncio.sleep(0)  # followers read the store while more commits land
        if value % 40 == 0:
            await asyncio.sleep(0.006)  # a commit between some of them
    result = JobResult(JobStatus.SUCCESS, {}, {}, [], None, [])
    assert await store.finish("p", job.attempt, result)
    log.job_finished(job, result)
    await log.flush()

    stored = await log._all("p")
    assert len(stored) == 601 and stored[-1].done
    for follower in followers:
        assert await follower == stored


async def test_a_follower_that_falls_behind_reads_the_rest_from_the_store(
    store: SQLiteStore, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_log_module, "MAX_QUEUED", 5)
    job = await running_job(store, "p")
    log.job_started(job)
    stream = log.follow("p")
    log.job_event(job, progress(job, 0))
    first = await anext(stream)  # now live, then 300 events commit while it waits
    for value in range(1, 301):
        log.job_event(job, progress(job, value))
    await log.flush()
    log.job_finished(job, JobResult(JobStatus.SUCCESS, {}, {}, [], None, []))
    rest = [event async for event in stream]
    assert [first, *rest] == await log._all("p")


async def test_resuming_after_an_id_gives_exactly_what_followed_it(
    store: SQLiteStore, log: EventLog
) -> None:
    job = await running_job(store, "p")
    for value in range(10):
        log.job_event(job, progress(job, value))
    result = JobResult(JobStatus.SUCCESS, {}, {}, [], None, [])
    assert await store.finish("p", job.attempt, result)
    log.job_finished(job, result)
    everything = await collect(log, "p")
    assert await collect(log, "p", everything[3].id) == everything[4:]
    assert await collect(log, "p", everything[-1].id) == []  # ended before: nothing more
    assert await log.ended_before("p", everything[-1].id)
    assert not await log.ended_before("p", everything[-2].id)


def later_log(store: SQLiteStore) -> EventLog:
    """A log whose clock is past SETTLE_AFTER: ends recorded now are not recent to it."""
    return EventLog(
        store, retention=3600, clock=lambda: time.time() + event_log_module.SETTLE_AFTER + 1
    )


async def test_a_stream_whose_end_was_never_logged_gets_it_from_the_history(
    store: SQLiteStore,
) -> None:
    # The process that ran it died after recording the end, before the log was written.
    log = later_log(store)
    job = await running_job(store, "p")
    end = {"prompt_id": "p", "timestamp": 1}
    result = JobResult(JobStatus.SUCCESS, {}, {}, [["execution_success", end]], None, [])
    assert await store.finish("p", job.attempt, result)
    followed = await collect(log, "p")
    assert [(e.type, e.data) for e in followed] == [
        ("execution_success", end),
        ("executing", events.executing("p", None)),
    ]
    assert await collect(log, "p") == followed  # appended once, read back by the next
    await log.close()


async def test_a_recent_end_is_left_to_the_gateway_that_ran_it(
    store: SQLiteStore, log: EventLog
) -> None:
    job = await running_job(store, "p")
    result = JobResult(JobStatus.SUCCESS, {}, {}, [], None, [])
    assert await store.finish("p", job.attempt, result)
    assert not await log.ended_before("p", 10**9)  # nothing appended by a follower yet
    assert await store.prompt_events("p") == []


async def test_a_prompt_cancelled_in_the_queue_ends_with_the_done_signal(
    store: SQLiteStore,
) -> None:
    log = later_log(store)
    await store.submit(NewJob("queued", 1, False, {}, {}, []))
    follower = asyncio.create_task(collect(log, "queued"))
    assert await store.cancel(["queued"], pending_only=True) == ["queued"]
    followed = await follower
    assert [(e.type, e.data) for e in followed] == [("executing", events.executing("queued", None))]
    await log.close()


async def test_closing_the_log_writes_what_is_buffered_and_ends_followers(
    store: SQLiteStore,
) -> None:
    log = EventLog(store, retention=3600, flush_interval=60)  # never flushed on its own
    job = await running_job(store, "p")
    log.job_started(job)
    follower = asyncio.create_task(collect(log, "p"))
    log.job_event(job, progress(job, 1))
    await log.close()
    assert len(await store.prompt_events("p")) == 1
    assert len(await follower) <= 1  # ended without a done signal: the job still runs


# -- progress_state: changes logged, whole frames followed --------------------------------


def entry(job: Job, node: str, state: str, value: float = 0.0) -> dict[str, object]:
    return {
        "value": value,
        "max": 1.0,
        "state": state,
        "node_id": node,
        "prompt_id": job.prompt_id,
        "display_node_id": node,
        "parent_node_id": None,
        "real_node_id": node,
    }


def whole(job: Job, *entries: dict[str, object]) -> Message:
    """A backend's progress_state frame: every node it started."""
    nodes = {str(e["node_id"]): e for e in entries}
    return Message("progress_state", {"prompt_id": job.prompt_id, "nodes": nodes})


async def test_a_backends_whole_frames_are_logged_as_changes_and_followed_whole(
    store: SQLiteStore, log: EventLog
) -> None:
    job = await running_job(store, "p")
    log.job_started(job)
    a_run, a_done = entry(job, "a", "running"), entry(job, "a", "finished", 1.0)
    b_run = entry(job, "b", "running")
    frames = [whole(job, a_run), whole(job, a_done), whole(job, a_done, b_run)]
    for frame in frames:
        log.job_event(job, frame)
    log.job_event(job, whole(job, b_run))  # a node dropped: kept whole
    await log.flush()

    stored = [e.data for e in await store.prompt_events("p", limit=100)]
    assert stored[0] == frames[0].data  # an attempt's first frame is whole
    assert stored[1] == {"prompt_id": "p", "nodes": {"a": a_done}, "changes": True}
    assert stored[2] == {"prompt_id": "p", "nodes": {"b": b_run}, "changes": True}
    assert stored[3] == whole(job, b_run).data
    followed = await asyncio.wait_for(_until(log, "p", 4), 5)
    assert [e.data for e in followed] == [f.data for f in frames] + [whole(job, b_run).data]


async def test_a_new_attempt_logs_its_first_frame_whole(store: SQLiteStore, log: EventLog) -> None:
    job = await running_job(store, "p")
    log.job_started(job)
    log.job_event(job, NodeProgress("p", "a", entry(job, "a", "finished", 1.0)))
    log.job_stopped(job)  # its lane was lost: it runs again, from the start
    log.job_started(job)
    log.job_event(job, NodeProgress("p", "b", entry(job, "b", "running")))
    await log.flush()
    followed = await asyncio.wait_for(_until(log, "p", 2), 5)
    assert [list(e.data["nodes"]) for e in followed] == [["a"], ["b"]]


async def test_past_its_cap_a_prompt_logs_only_results_ends_and_node_starts_and_finishes(
    store: SQLiteStore,
) -> None:
    log = EventLog(store, retention=3600, flush_interval=0.005, max_prompt_bytes=4096)
    try:
        job = await running_job(store, "p")
        log.job_started(job)
        for k in range(40):  # each node: start, progress updates, finish, its output
            node = f"n{k}"
            log.job_event(job, Message("executing", events.executing("p", node)))
            log.job_event(job, NodeProgress("p", node, entry(job, node, "running")))
            for value in (0.25, 0.5):
                log.job_event(job, NodeProgress("p", node, entry(job, node, "running", value)))
                log.job_event(job, progress(job, int(value * 1000)))
            log.job_event(job, NodeProgress("p", node, entry(job, node, "finished", 1.0)))
            log.job_event(job, Message("executed", events.executed("p", node, {"text": [node]})))
        result = JobResult(JobStatus.SUCCESS, {}, {}, [], None, [])
        assert await store.finish("p", job.attempt, result)
        log.job_finished(job, result)
        await log.flush()
        stored = await store.prompt_events("p", limit=10_000)
        kinds = [e.type for e in stored]
        assert kinds.count("executed") == 40 and kinds.count("executing") == 41 and stored[-1].done
        assert 0 < kinds.count("progress") < 80  # the first nodes' only
        followed = await asyncio.wait_for(_until(log, "p", 1_000), 5)
        states = [e.data["nodes"] for e in followed if e.type == "progress_state"]
        assert len(states) < 160  # value updates left out past the cap
        assert {n: s["state"] for n, s in states[-1].items()} == {
            f"n{k}": "finished" for k in range(40)
        }
    finally:
        await log.close()


async def _until(log: EventLog, prompt_id: str, count: int) -> list[PromptEvent]:
    """The first `count` events a follower gets (fewer when the stream ends first)."""
    found: list[PromptEvent] = []
    async for event in log.follow(prompt_id):
        if event.done:
            break
        found.append(event)
        if len(found) == count:
            break
    return found
