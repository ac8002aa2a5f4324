"""Each tenant's queue, for fair share (shares/picking.py): a tenant's claimable jobs in
dispatch order, and each tenant's counts of pending and running jobs, run against every
store implementation."""

from __future__ import annotations

import asyncio
import math

from comfyfleet.domain.shares import TenantCounts
from comfyfleet.store.base import JobStore
from tests.unit.store.job_helpers import new_job, result
from tests.unit.store.stores import Clock


async def test_a_tenants_candidates_are_its_claimable_jobs_in_dispatch_order(
    store: JobStore,
) -> None:
    await store.submit(new_job("a1", 5, tenant="alice"))
    await store.submit(new_job("b1", 1, tenant="bob"))
    await store.submit(new_job("a2", 2, tenant="alice"))
    await store.submit(new_job("a3", 0, front=True, tenant="alice"))
    await store.submit(new_job("a4", 3, tenant="alice"))
    reserved = await store.candidates(1, tenant="alice")
    assert [j.prompt_id for j in reserved] == ["a3"]
    assert await store.reserve_job(reserved[0], "lane") is not None  # no longer claimable
    page = await store.candidates(2, tenant="alice")
    assert [j.prompt_id for j in page] == ["a2", "a4"]
    rest = await store.candidates(10, page[-1], tenant="alice")
    assert [j.prompt_id for j in rest] == ["a1"]
    assert [j.prompt_id for j in await store.candidates(10, tenant="bob")] == ["b1"]
    assert await store.candidates(10, tenant="nobody") == []
    everyone = await store.candidates(10)
    assert [j.prompt_id for j in everyone] == ["b1", "a2", "a4", "a1"]


async def test_tenant_counts_are_claimable_and_running_jobs(store: JobStore, clock: Clock) -> None:
    assert await store.tenant_counts() == {}
    await store.submit(new_job("a1", 1, tenant="alice"))
    first = clock.now
    clock.advance(5)
    await store.submit(new_job("a2", 2, tenant="alice"))
    await store.submit(new_job("b1", 3, tenant="bob"))
    await store.submit(new_job("b2", 4, tenant="bob"))
    await store.submit(new_job("c1", 5, tenant="carol"))
    (a1,) = await store.candidates(1, tenant="alice")
    assert await store.claim_job(a1, "lane") is not None
    (b1,) = await store.candidates(1, tenant="bob")
    assert await store.reserve_job(b1, "lane") is not None  # pending, not claimable
    await store.cancel(["c1"], pending_only=True)
    counts = await store.tenant_counts()
    assert counts == {
        "alice": TenantCounts(pending=1, running=1, oldest=first + 5),
        "bob": TenantCounts(pending=1, running=0, oldest=first + 5),
    }
    (a2,) = await store.candidates(1, tenant="alice")
    assert await store.claim_job(a2, "lane") is not None
    assert (await store.tenant_counts())["alice"] == TenantCounts(0, 2, math.inf)


async def test_a_capped_claim_holds_under_concurrent_claims(store: JobStore) -> None:
    """Twenty claims at once of a tenant capped at three running jobs: three start
    (on PostgreSQL, claims of one capped tenant count one after the other across
    gateways); another tenant's claims are not held back."""
    for n in range(20):
        await store.submit(new_job(f"a{n}", n, tenant="alice"))
    await store.submit(new_job("b0", 99, tenant="bob"))
    page = await store.candidates(20, tenant="alice")
    claimed = await asyncio.gather(*(store.claim_job(job, "lane", 3) for job in page))
    assert sum(job is not None for job in claimed) == 3
    assert (await store.tenant_counts())["alice"].running == 3
    (b0,) = await store.candidates(1, tenant="bob")
    assert await store.claim_job(b0, "lane", 3) is not None
    running = [job for job in claimed if job is not None]
    await store.finish(running[0].prompt_id, running[0].attempt, result())
    (next_one,) = await store.candidates(1, tenant="alice")
    assert await store.claim_job(next_one, "lane", 3) is not None  # a place came free
