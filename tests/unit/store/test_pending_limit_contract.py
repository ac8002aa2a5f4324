"""The pending limit of `submit`, run against every store (the fixtures of conftest.py):
the store counts the pending jobs in the write itself, so processes sharing it never
queue more than the limit between them, however many submit at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.idempotency import IdempotentRequest
from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.store.base import JobStore, PendingLimitReached
from tests.unit.store.stores import Clock, StoreFactory, claim_next


def new_job(prompt_id: str, **kw: Any) -> NewJob:
    prompt = {"1": {"class_type": "Noop", "inputs": {"tag": prompt_id}}}
    return NewJob(prompt_id, 1, False, prompt, {}, ["1"], **kw)


async def pending(store: JobStore) -> int:
    return (await store.counts())[JobStatus.PENDING]


async def test_a_submit_past_the_limit_is_refused_and_writes_nothing(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}"), max_pending=3)
    with pytest.raises(PendingLimitReached) as refused:
        await store.submit(new_job("p3"), max_pending=3)
    assert refused.value.limit == 3
    assert await store.get("p3") is None
    assert await pending(store) == 3
    # Without a limit, or with a higher one, it goes in.
    await store.submit(new_job("p4"), max_pending=5)
    await store.submit(new_job("p5"))
    assert await pending(store) == 5


async def test_a_claimed_job_frees_its_place(store: JobStore) -> None:
    await store.submit(new_job("p0"), max_pending=1)
    with pytest.raises(PendingLimitReached):
        await store.submit(new_job("p1"), max_pending=1)
    assert await claim_next(store, "lane") is not None
    await store.submit(new_job("p1"), max_pending=1)
    # A hand-off to a lane queues nothing: the limit is not asked.
    handed = await store.submit(new_job("p2"), claim_for="lane", max_pending=1)
    assert handed.status is JobStatus.RUNNING


async def test_a_refused_keyed_submit_leaves_its_key_free(store: JobStore) -> None:
    answer = {"prompt_id": "k", "number": 1, "node_errors": {}}
    keyed = new_job("k", idempotency=IdempotentRequest("key-1", "hash", answer))
    await store.submit(new_job("p0"), max_pending=1)
    with pytest.raises(PendingLimitReached):
        await store.submit(keyed, max_pending=1)
    assert await store.idempotent_request("default", "key-1") is None
    await store.submit(keyed, max_pending=2)
    assert await store.idempotent_request("default", "key-1") is not None


@pytest.mark.parametrize("limit", [12, 130])
async def test_stores_sharing_the_data_never_queue_past_the_limit_together(
    factory: StoreFactory, tmp_path: Path, clock: Clock, limit: int
) -> None:
    """Three stores on one data (three gateways), 60 submits each at once: exactly
    `limit` go in. At 130 (past PostgreSQL's margin of max_connections, 100 by default)
    the first submits share the admission lock and the last ones take it in turn."""
    stores = [factory(tmp_path, clock, owner=f"gw{n}") for n in range(3)]
    for opened in stores:
        await opened.open()
    try:

        async def submit(opened: JobStore, prompt_id: str) -> bool:
            try:
                await opened.submit(new_job(prompt_id), max_pending=limit)
            except PendingLimitReached:
                return False
            return True

        admitted = await asyncio.gather(
            *(submit(opened, f"g{n}-{i}") for i in range(60) for n, opened in enumerate(stores))
        )
        assert sum(admitted) == limit
        assert await pending(stores[0]) == limit
    finally:
        for opened in stores:
            await opened.close()
