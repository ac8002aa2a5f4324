"""A pending job's place in the queue (Comfy API v2's queue_position), run against
every store implementation."""

from __future__ import annotations

import pytest

from comfyfleet.store.base import JobStore
from comfyfleet.store.postgres_parts import claims
from comfyfleet.store.sqlite_parts import queue_reads
from tests.unit.store.job_helpers import new_job, result


async def test_a_pending_jobs_place_is_its_rank_in_dispatch_order(store: JobStore) -> None:
    """Front jobs first (in the order they came), then by number, then by submission;
    1 is the next to go. Reserved jobs still wait, so they count."""
    await store.submit(new_job("a1", 5, tenant="alice"))
    await store.submit(new_job("b1", 1, tenant="bob"))
    await store.submit(new_job("a2", 2, tenant="alice"))
    await store.submit(new_job("a3", 0, front=True, tenant="alice"))
    await store.submit(new_job("b2", 0, front=True, tenant="bob"))
    await store.submit(new_job("a4", 2, tenant="alice"))  # same number as a2: after it
    places = {p: await store.queue_position(p) for p in ("a3", "b2", "b1", "a2", "a4", "a1")}
    assert places == {"a3": 1, "b2": 2, "b1": 3, "a2": 4, "a4": 5, "a1": 6}
    own = {p: await store.queue_position(p, own_tenant=True) for p in ("a3", "a2", "a4", "a1")}
    assert own == {"a3": 1, "a2": 2, "a4": 3, "a1": 4}
    assert await store.queue_position("b1", own_tenant=True) == 2
    (first,) = await store.candidates(1)
    assert await store.reserve_job(first, "lane") is not None  # set aside: still waiting
    assert await store.queue_position("a1") == 6


async def test_only_pending_jobs_have_a_place(store: JobStore) -> None:
    await store.submit(new_job("j1", 1))
    await store.submit(new_job("j2", 2))
    await store.submit(new_job("j3", 3))
    assert await store.queue_position("j3") == 3
    (first,) = await store.candidates(1)
    running = await store.claim_job(first, "lane")
    assert running is not None
    assert await store.queue_position("j1") is None  # running
    assert await store.queue_position("j3") == 2  # one fewer ahead
    await store.cancel(["j2"], pending_only=True)
    assert await store.queue_position("j2") is None
    assert await store.queue_position("j3") == 1
    await store.finish("j1", running.attempt, result())
    assert await store.queue_position("j1") is None
    assert await store.queue_position("nobody") is None


async def test_a_place_deep_in_the_queue_reads_as_the_cap(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count stops at the cap (a bound on one read's walk); patched down to 3 here
    rather than queueing 10,000 jobs."""
    for module in (queue_reads, claims):
        monkeypatch.setattr(module, "MAX_QUEUE_POSITION", 3)
    for n in range(6):
        await store.submit(new_job(f"j{n}", n))
    places = [await store.queue_position(f"j{n}") for n in range(6)]
    assert places == [1, 2, 3, 3, 3, 3]
    assert await store.queue_position("j5", own_tenant=True) == 3
