"""Idempotency keys, run against every store (the fixtures of conftest.py): a key is
recorded with its job in one transaction, per tenant, and is free again after the window."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.idempotency import (
    IDEMPOTENCY_WINDOW,
    IdempotencyKeyTaken,
    IdempotentRequest,
)
from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.store.base import DuplicateJob, JobStore
from comfyfleet.store.sqlite import SQLiteStore
from tests.postgres import killed_sessions_settled, schema_for
from tests.unit.store.stores import Clock, kill_while_submitting


def keyed(prompt_id: str, key: str = "k1", request_hash: str = "h1", **kw: Any) -> NewJob:
    answer = {"prompt_id": prompt_id, "number": 3, "node_errors": {}}
    request = IdempotentRequest(key, request_hash, answer)
    prompt = {"1": {"class_type": "Noop", "inputs": {}}}
    return NewJob(prompt_id, 3, False, prompt, {}, ["1"], idempotency=request, **kw)


async def pending_ids(store: JobStore) -> list[str]:
    _, pending = await store.queue()
    return [job.prompt_id for job in pending]


async def test_the_key_is_recorded_with_its_answer(store: JobStore, clock: Clock) -> None:
    job = await store.submit(keyed("p1"))
    assert job.prompt_id == "p1" and job.status is JobStatus.PENDING
    first = await store.idempotent_request("default", "k1")
    assert first == IdempotentRequest(
        "k1", "h1", {"prompt_id": "p1", "number": 3, "node_errors": {}}, clock.now
    )
    assert await store.idempotent_request("default", "other") is None


async def test_a_taken_key_queues_nothing_and_names_the_first(store: JobStore) -> None:
    await store.submit(keyed("p1"))
    with pytest.raises(IdempotencyKeyTaken) as taken:
        await store.submit(keyed("p2", request_hash="h2"))
    assert taken.value.first.answer["prompt_id"] == "p1"
    assert taken.value.first.request_hash == "h1"
    assert await store.get("p2") is None
    assert await pending_ids(store) == ["p1"]


async def test_concurrent_submits_with_one_key_queue_one_job(store: JobStore) -> None:
    outcomes = await asyncio.gather(
        *(store.submit(keyed(f"p{i}")) for i in range(12)), return_exceptions=True
    )
    queued = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, IdempotencyKeyTaken)]
    assert len(queued) == 1 and len(refused) == 11
    winner = queued[0].prompt_id
    assert {r.first.answer["prompt_id"] for r in refused} == {winner}
    assert await pending_ids(store) == [winner]


async def test_keys_belong_to_one_tenant(store: JobStore) -> None:
    await store.submit(keyed("p1", tenant="alice"))
    await store.submit(keyed("p2", tenant="bob"))
    alice = await store.idempotent_request("alice", "k1")
    bob = await store.idempotent_request("bob", "k1")
    assert alice is not None and alice.answer["prompt_id"] == "p1"
    assert bob is not None and bob.answer["prompt_id"] == "p2"
    assert await store.idempotent_request("default", "k1") is None


async def test_a_key_is_free_again_after_the_window(store: JobStore, clock: Clock) -> None:
    await store.submit(keyed("p1"))
    clock.advance(IDEMPOTENCY_WINDOW - 1)
    assert await store.idempotent_request("default", "k1") is not None
    with pytest.raises(IdempotencyKeyTaken):
        await store.submit(keyed("p2"))
    clock.advance(1)
    assert await store.idempotent_request("default", "k1") is None
    await store.submit(keyed("p2", request_hash="h2"))
    again = await store.idempotent_request("default", "k1")
    assert again is not None and again.answer["prompt_id"] == "p2"
    assert (again.request_hash, again.created_at) == ("h2", clock.now)
    assert await pending_ids(store) == ["p1", "p2"]


async def test_expired_keys_of_others_do_not_block(store: JobStore, clock: Clock) -> None:
    for i in range(40):  # more than one submit forgets at once
        await store.submit(keyed(f"old{i}", key=f"old{i}"))
    clock.advance(IDEMPOTENCY_WINDOW + 5)
    for i in range(40):
        await store.submit(keyed(f"new{i}", key=f"old{i}"))
        found = await store.idempotent_request("default", f"old{i}")
        assert found is not None and found.answer["prompt_id"] == f"new{i}"


async def test_a_refused_job_leaves_no_key(store: JobStore) -> None:
    await store.submit(keyed("p1", key="k1"))
    with pytest.raises(DuplicateJob):
        await store.submit(keyed("p1", key="k2"))
    assert await store.idempotent_request("default", "k2") is None
    await store.submit(keyed("p2", key="k2"))  # the key is still free


async def test_a_keyed_hand_off_is_claimed_at_once(store: JobStore, clock: Clock) -> None:
    job = await store.submit(keyed("p1"), claim_for="lane")
    assert (job.status, job.attempt, job.lane) == (JobStatus.RUNNING, 1, "lane")
    with pytest.raises(IdempotencyKeyTaken):
        await store.submit(keyed("p2"), claim_for="lane")
    running, pending = await store.queue()
    assert [j.prompt_id for j in running] == ["p1"] and pending == []


async def test_keys_outlive_a_reopen(store: JobStore, reopen: Callable[[JobStore], Any]) -> None:
    await store.submit(keyed("p1", key="k\u2603 \"'"))
    store = await reopen(store)
    try:
        first = await store.idempotent_request("default", "k\u2603 \"'")
        assert first is not None and first.answer["prompt_id"] == "p1"
    finally:
        await store.close()


async def test_unkeyed_jobs_record_no_key(store: JobStore) -> None:
    await store.submit(replace(keyed("p1"), idempotency=None))
    await store.submit(keyed("p2"))
    first = await store.idempotent_request("default", "k1")
    assert first is not None and first.answer["prompt_id"] == "p2"


KEYED_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from comfyfleet.domain.idempotency import IdempotentRequest
    from comfyfleet.domain.jobs import NewJob
    from comfyfleet.store.postgres import PostgresStore
    from comfyfleet.store.sqlite import SQLiteStore

    async def submitter(store, worker):
        for i in range(1_000_000):
            pid = f"w{worker}-{i}"
            keyed = IdempotentRequest(f"key-{pid}", "h", {"prompt_id": pid})
            prompt = {"1": {"class_type": "Noop", "inputs": {}}}
            await store.submit(NewJob(pid, i, False, prompt, {}, ["1"], idempotency=keyed))
            print(pid, flush=True)

    async def main():
        if sys.argv[1] == "sqlite":
            store = SQLiteStore(Path(sys.argv[2]) / "jobs.db", synchronous="NORMAL")
        else:
            store = PostgresStore(sys.argv[2], schema=sys.argv[3])
        await store.open()
        print("open", flush=True)
        await asyncio.gather(*(submitter(store, w) for w in range(8)))

    asyncio.run(main())
    """
)


async def test_a_sigkill_never_splits_a_key_from_its_job(
    store: JobStore, clock: Clock, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if isinstance(store, SQLiteStore):
        args = ["sqlite", str(tmp_path)]
    else:
        args = ["postgres", request.getfixturevalue("postgres_url"), schema_for(tmp_path)]
    committed = await asyncio.to_thread(kill_while_submitting, KEYED_CHILD, args, 300)
    if not isinstance(store, SQLiteStore):
        await killed_sessions_settled(args[1])
    clock.now = time.time()  # the child recorded its keys by the real clock
    jobs, _ = await store.jobs()
    stored = {job.prompt_id for job in jobs}
    assert set(committed) <= stored
    for prompt_id in stored:  # every job has its key ...
        first = await store.idempotent_request("default", f"key-{prompt_id}")
        assert first is not None and first.answer == {"prompt_id": prompt_id}
    for worker in range(8):  # ... and the submit under way at the kill left neither
        done = [int(p.split("-")[1]) for p in stored if p.startswith(f"w{worker}-")]
        in_flight = f"w{worker}-{max(done, default=-1) + 1}"
        assert await store.idempotent_request("default", f"key-{in_flight}") is None
