"""The retry policy: lane failures re-queue up to the attempt cap; a prompt taken back
from a backend's queue (for a free slot elsewhere) did not fail and does not count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from comfyfleet.domain.jobs import Job, JobStatus, NewJob
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.local import LocalLane
from comfyfleet.nodes import build_registry
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.store.sqlite import SQLiteStore
from tests.unit.store.stores import claim_next

PROMPT = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}}


@pytest.fixture
def lane(tmp_path: Path) -> Iterator[LocalLane]:
    engine = Engine(build_registry(testing=True), Folders.under(tmp_path / "d"))
    yield LocalLane(engine, 1)
    engine.close()


async def attempt(store: SQLiteStore, kind: str | None) -> Job:
    """Claim the job; with `kind`, put it back as that kind of requeue."""
    job = await claim_next(store, "lane")
    assert job is not None
    if kind is not None:
        assert await store.requeue(job.prompt_id, job.attempt, {"kind": kind, "lane": "b"})
    return job


async def test_lane_failures_requeue_up_to_the_cap(store: SQLiteStore, lane: LocalLane) -> None:
    policy = RetryPolicy(store, max_attempts=2)
    await store.submit(NewJob("p", 0, False, PROMPT, {}, ["1"]))
    first = await attempt(store, None)
    decision = await policy.decide(first, lane, None, {"lane": "b", "error": "lost"})
    assert decision.requeue and decision.reason == {"kind": "lane", "lane": "b", "error": "lost"}
    assert await store.requeue("p", first.attempt, decision.reason)
    second = await attempt(store, None)
    final = await policy.decide(second, lane, None, {"lane": "b", "error": "lost"})
    assert not final.requeue and final.result is not None
    assert final.result.status is JobStatus.ERROR
    assert "failed on its lane 2 times" in final.result.error["exception_message"]  # type: ignore[index]


async def test_taken_back_attempts_do_not_count(store: SQLiteStore, lane: LocalLane) -> None:
    policy = RetryPolicy(store, max_attempts=2)
    await store.submit(NewJob("p", 0, False, PROMPT, {}, ["1"]))
    await attempt(store, "taken_back")
    await attempt(store, "taken_back")
    third = await attempt(store, None)
    assert third.attempt == 3
    decision = await policy.decide(third, lane, None, {"lane": "b", "error": "lost"})
    assert decision.requeue  # one failure so far, of two allowed
    assert await store.requeue("p", third.attempt, decision.reason)
    fourth = await attempt(store, None)
    final = await policy.decide(fourth, lane, None, {"lane": "b", "error": "lost"})
    assert not final.requeue
    assert "failed on its lane 2 times" in final.result.error["exception_message"]  # type: ignore[union-attr,index]
