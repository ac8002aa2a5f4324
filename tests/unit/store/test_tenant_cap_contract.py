"""A tenant's cap on pending jobs (`submit(max_queued=...)`), run against every store
(the fixtures of conftest.py): counted in the insert's own transaction, so gateways
sharing the store never queue more than the cap of one tenant between them, while
other tenants' submits go on as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.idempotency import IdempotentRequest
from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.store.base import JobStore, PendingLimitReached, QueuedLimitReached
from tests.unit.store.stores import Clock, StoreFactory, claim_next, reserve_next


def new_job(prompt_id: str, tenant: str = "alice", **kw: Any) -> NewJob:
    prompt = {"1": {"class_type": "Noop", "inputs": {"tag": prompt_id}}}
    return NewJob(prompt_id, 1, False, prompt, {}, ["1"], tenant=tenant, **kw)


async def pending_of(store: JobStore, tenant: str) -> int:
    _, pending = await store.queue(tenant=tenant)
    return len(pending)


async def test_a_submit_past_the_cap_is_refused_and_writes_nothing(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"a{i}"), max_queued=3)
    with pytest.raises(QueuedLimitReached) as refused:
        await store.submit(new_job("a3"), max_queued=3)
    assert refused.value.limit == 3
    assert "3" in str(refused.value)
    assert await store.get("a3") is None
    assert await pending_of(store, "alice") == 3
    # Another tenant's jobs neither count against alice's cap nor meet it.
    await store.submit(new_job("b0", tenant="bob"), max_queued=3)
    await store.submit(new_job("b1", tenant="bob"))
    assert await pending_of(store, "bob") == 2


async def test_a_cap_of_zero_refuses_every_queued_submit(store: JobStore) -> None:
    with pytest.raises(QueuedLimitReached):
        await store.submit(new_job("a0"), max_queued=0)
    assert await store.get("a0") is None


async def test_a_started_job_frees_its_place_and_a_reserved_one_does_not(
    store: JobStore,
) -> None:
    await store.submit(new_job("a0"), max_queued=1)
    with pytest.raises(QueuedLimitReached):
        await store.submit(new_job("a1"), max_queued=1)
    # Reserved for a lane, a job still waits: it keeps its place.
    assert await reserve_next(store, "lane") is not None
    with pytest.raises(QueuedLimitReached):
        await store.submit(new_job("a1"), max_queued=1)
    await store.unreserve(["a0"])
    assert await claim_next(store, "lane") is not None
    await store.submit(new_job("a1"), max_queued=1)
    # A cancelled job frees its place too.
    await store.cancel(["a1"], pending_only=True)
    await store.submit(new_job("a2"), max_queued=1)


async def test_a_hand_off_to_a_lane_queues_nothing_so_the_cap_is_not_asked(
    store: JobStore,
) -> None:
    await store.submit(new_job("a0"), max_queued=1)
    handed = await store.submit(new_job("a1"), claim_for="lane", max_queued=1)
    assert handed.status is JobStatus.RUNNING
    assert await pending_of(store, "alice") == 1


async def test_the_cap_is_checked_before_the_pending_limit(store: JobStore) -> None:
    await store.submit(new_job("a0"), max_queued=1, max_pending=1)
    with pytest.raises(QueuedLimitReached):
        await store.submit(new_job("a1"), max_queued=1, max_pending=1)
    # Bob has room under his cap, not in the queue.
    with pytest.raises(PendingLimitReached):
        await store.submit(new_job("b0", tenant="bob"), max_queued=5, max_pending=1)
    assert await store.get("b0") is None


async def test_a_refused_keyed_submit_leaves_its_key_free(store: JobStore) -> None:
    answer = {"prompt_id": "k", "number": 1, "node_errors": {}}
    keyed = new_job("k", idempotency=IdempotentRequest("key-1", "hash", answer))
    await store.submit(new_job("a0"), max_queued=1)
    with pytest.raises(QueuedLimitReached):
        await store.submit(keyed, max_queued=1)
    assert await store.idempotent_request("alice", "key-1") is None
    await store.submit(keyed, max_queued=2)
    assert await store.idempotent_request("alice", "key-1") is not None


@pytest.mark.parametrize("cap", [1, 17])
async def test_200_submits_at_once_admit_exactly_the_cap(
    factory: StoreFactory, tmp_path: Path, clock: Clock, cap: int
) -> None:
    """Two stores on one data (two gateways): 200 submits of alice at once (half through
    each, some keyed) with her cap, interleaved with 40 of bob, who has none. Exactly
    `cap` of alice's go in, and every one of bob's."""
    stores = [factory(tmp_path, clock, owner=f"gw{n}") for n in range(2)]
    for opened in stores:
        await opened.open()
    try:

        async def submit(opened: JobStore, job: NewJob, max_queued: int | None) -> bool:
            try:
                await opened.submit(job, max_queued=max_queued)
            except QueuedLimitReached:
                return False
            return True

        def alice(i: int) -> NewJob:
            if i % 4:
                return new_job(f"a{i}")
            answer = {"prompt_id": f"a{i}", "number": 1, "node_errors": {}}
            return new_job(f"a{i}", idempotency=IdempotentRequest(f"k{i}", "hash", answer))

        tries = [("alice", submit(stores[i % 2], alice(i), cap)) for i in range(200)]
        for i in range(40):
            bob = new_job(f"b{i}", tenant="bob")
            tries.insert(i * 5, ("bob", submit(stores[i % 2], bob, None)))
        admitted = await asyncio.gather(*(attempt for _, attempt in tries))
        by_tenant = {"alice": 0, "bob": 0}
        for (tenant, _), ok in zip(tries, admitted, strict=True):
            by_tenant[tenant] += ok
        assert by_tenant == {"alice": cap, "bob": 40}
        for opened in stores:
            assert await pending_of(opened, "alice") == cap
            assert await pending_of(opened, "bob") == 40
    finally:
        for opened in stores:
            await opened.close()
