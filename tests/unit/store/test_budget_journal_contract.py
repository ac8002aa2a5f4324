"""Budgets in the remote-job journal, over every journal (SQLite, PostgreSQL, the
in-memory one of `comfyfleet run`): what counts as a paid job of a tenant's day or of a
prompt, and a new job refused in the write that would record it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.budgets import Budget, BudgetCheck, BudgetExceeded, HoldRequest, Usage
from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJobState
from comfyfleet.fanout.journal import MemoryJournal
from comfyfleet.store.base import JobStore, RemoteJobJournal
from tests.unit.store.stores import STORES, Clock, StoreFactory, postgres_factory, sqlite_store
from tests.unit.store.test_journal_contract import new

NO_LIMIT = Budget()


@pytest.fixture(params=[*STORES, "memory"])
async def journal(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[RemoteJobJournal]:
    if request.param == "memory":
        yield MemoryJournal(clock)
        return
    if request.param == "sqlite":
        made: JobStore = sqlite_store(tmp_path, clock)
    else:
        made = postgres_factory(request.getfixturevalue("postgres_url"))(tmp_path, clock)
    await made.open()
    yield made
    await made.close()


def paid(job_id: str, tenant: str = "alice", cost: float | None = 0.04, **kw: Any) -> NewRemoteJob:
    """A job of its own request, of `tenant`'s prompt."""
    job = new(job_id, kw.pop("request_hash", f"h-{job_id}"), **kw)
    return dataclasses.replace(job, tenant=tenant, model="flux-2-pro", cost=cost)


def check(
    since: float,
    tenant_budget: Budget = NO_LIMIT,
    prompt_budget: Budget = NO_LIMIT,
    cost: float | None = 0.04,
) -> BudgetCheck:
    return BudgetCheck("alice", tenant_budget, prompt_budget, since, cost)


async def test_a_tenants_day_counts_every_job_that_may_have_been_billed(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    await journal.record_remote_job(paid("yesterday"))
    clock.advance(100)
    since = clock.now
    for job_id in ("live", "done", "refused", "ambiguous", "cancelled"):
        await journal.record_remote_job(paid(job_id))
    await journal.record_remote_job(paid("bob's", tenant="bob"))
    await journal.record_remote_job(paid("free", cost=None))
    assert await journal.remote_job_submitted("done", "task-1", {})
    assert await journal.finish_remote_job(
        "done", RemoteJobState.SUCCEEDED, result=b"png", result_type="image/png"
    )
    refused = {"class": "ProviderError", "message": "bfl: bad request", "status": 422}
    assert await journal.finish_remote_job("refused", RemoteJobState.FAILED, error=refused)
    lost = {"class": "AmbiguousSubmit", "message": "timed out after sending", "status": None}
    assert await journal.finish_remote_job("ambiguous", RemoteJobState.FAILED, error=lost)
    assert await journal.finish_remote_job("cancelled", RemoteJobState.CANCELLED)
    used = await journal.paid_usage("alice", since)
    # live, done, ambiguous, cancelled and free; not the one the provider refused
    assert used.paid_jobs == 5
    assert used.spend == pytest.approx(4 * 0.04)
    assert (await journal.paid_usage("bob", since)).paid_jobs == 1
    assert (await journal.paid_usage("alice", since - 100)).paid_jobs == 6


async def test_a_job_past_the_tenants_budget_is_refused_and_not_recorded(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    budget = check(clock.now, Budget(paid_jobs=2))
    await journal.record_remote_job(paid("j1"), budget)
    await journal.record_remote_job(paid("j2"), budget)
    with pytest.raises(BudgetExceeded, match=r"tenant alice's paid_jobs_per_day .* = 2"):
        await journal.record_remote_job(paid("j3"), budget)
    assert await journal.remote_job("j3") is None
    assert (await journal.paid_usage("alice", clock.now)).paid_jobs == 2
    # The next day starts counting afresh.
    clock.advance(86400)
    assert (await journal.record_remote_job(paid("j4"), check(clock.now, Budget(2)))).id == "j4"


async def test_a_job_the_provider_refused_frees_its_place(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    budget = check(clock.now, Budget(paid_jobs=1))
    await journal.record_remote_job(paid("j1"), budget)
    error = {"class": "ProviderError", "message": "bfl: 422", "status": 422}
    assert await journal.finish_remote_job("j1", RemoteJobState.FAILED, error=error)
    assert (await journal.record_remote_job(paid("j2"), budget)).id == "j2"


async def test_a_request_with_a_live_job_is_no_new_job(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    budget = check(clock.now, Budget(paid_jobs=1))
    first = await journal.record_remote_job(paid("j1", request_hash="same"), budget)
    again = await journal.record_remote_job(paid("j2", request_hash="same"), budget)
    assert again.id == first.id == "j1"  # it waits on j1: nothing more is paid


async def test_spend_is_counted_by_cost_and_an_unpriced_job_is_refused(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    dollar = Budget(spend=0.10)
    await journal.record_remote_job(paid("j1", cost=0.04), check(clock.now, dollar))
    await journal.record_remote_job(paid("j2", cost=0.04), check(clock.now, dollar))
    with pytest.raises(BudgetExceeded, match=r"spend_per_day .* = 0\.1: \$0\.08 counted"):
        await journal.record_remote_job(paid("j3", cost=0.04), check(clock.now, dollar))
    with pytest.raises(BudgetExceeded, match="no price"):
        await journal.record_remote_job(paid("j4", cost=None), check(clock.now, dollar, cost=None))
    used = await journal.paid_usage("alice", clock.now)
    assert used.paid_jobs == 2 and used.spend == pytest.approx(0.08)


async def test_a_prompts_budget_counts_that_prompts_jobs(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    mine = check(clock.now, prompt_budget=Budget(paid_jobs=1))
    await journal.record_remote_job(paid("other", prompt_id="p0"))  # another prompt's
    await journal.record_remote_job(paid("j1", prompt_id="p1"), mine)
    with pytest.raises(
        BudgetExceeded, match=r"the prompt's extra_data\.comfyfleet_budget\.paid_jobs"
    ):
        await journal.record_remote_job(paid("j2", prompt_id="p1"), mine)


@pytest.mark.parametrize("factory", STORES, indirect=True)
async def test_two_gateways_never_pass_a_tenants_budget_together(
    factory: StoreFactory, tmp_path: Path, clock: Clock
) -> None:
    a, b = factory(tmp_path, clock, owner="a"), factory(tmp_path, clock, owner="b")
    await a.open()
    await b.open()
    try:
        budget = check(clock.now, Budget(paid_jobs=3))

        async def one(store: JobStore, job_id: str) -> bool:
            try:
                await store.record_remote_job(paid(job_id), budget)
            except BudgetExceeded:
                return False
            return True

        done = await asyncio.gather(
            *(one(store, f"{store.owner}{n}") for n in range(10) for store in (a, b))
        )
        assert sum(done) == 3
        assert (await a.paid_usage("alice", clock.now)).paid_jobs == 3
    finally:
        await a.close()
        await b.close()


async def test_known_requests_are_those_reused_or_waited_on(journal: RemoteJobJournal) -> None:
    for job_id in ("kept", "live", "failed", "cancelled"):
        await journal.record_remote_job(paid(job_id))
    assert await journal.remote_job_submitted("kept", "task-1", {})
    assert await journal.finish_remote_job(
        "kept", RemoteJobState.SUCCEEDED, result=b"png", result_type="image/png"
    )
    error = {"class": "JobFailed", "message": "bfl: failed", "status": None}
    assert await journal.finish_remote_job("failed", RemoteJobState.FAILED, error=error)
    assert await journal.finish_remote_job("cancelled", RemoteJobState.CANCELLED)
    hashes = ["h-kept", "h-live", "h-failed", "h-cancelled", "h-never"]
    assert await journal.known_requests(hashes) == {"h-kept", "h-live"}
    assert await journal.known_requests([]) == set()
    many = [f"h-{n}" for n in range(1200)]  # past one statement's bound variables
    assert await journal.known_requests([*many, "h-kept"]) == {"h-kept"}


def hold_request(
    since: float,
    prompt_id: str = "p1",
    backend: str = "gpu-1",
    tenant_budget: Budget = NO_LIMIT,
    prompt_budget: Budget = NO_LIMIT,
    wanted: Usage | None = None,
) -> HoldRequest:
    return HoldRequest(prompt_id, backend, "alice", tenant_budget, prompt_budget, since, wanted)


async def test_a_hold_grants_what_the_budget_leaves_and_counts_until_settled(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    since = clock.now
    day = Budget(paid_jobs=10, spend=1.0)
    for n in range(3):
        await journal.record_remote_job(paid(f"j{n}"))  # 3 jobs, $0.12, in this gateway
    # A prompt of 4 counted jobs gets those 4: no more than it needs, held for alice.
    four = await journal.hold_paid_jobs(
        hold_request(since, "p1", "gpu-1", day, wanted=Usage(4, 0.16))
    )
    assert four.paid_jobs == 4 and four.spend == pytest.approx(0.16)
    assert (await journal.paid_usage("alice", since)).paid_jobs == 7
    # One whose count is known only as it runs gets all that is left, and holds it.
    rest = await journal.hold_paid_jobs(hold_request(since, "p2", "gpu-2", day))
    assert rest.paid_jobs == 3 and rest.spend == pytest.approx(1.0 - 0.12 - 0.16)
    assert (await journal.paid_usage("alice", since)).paid_jobs == 10
    nothing = await journal.hold_paid_jobs(hold_request(since, "p3", "gpu-1", day))
    assert nothing.paid_jobs == 0
    # Settled: what p2's backend says it spent counts, the rest of its hold is free again.
    assert await journal.settle_paid_jobs("p2", "gpu-2", Usage(1, 0.04))
    assert not await journal.settle_paid_jobs("p9", "gpu-2", Usage(1, 0.04))
    # A backend that says p1 spent more than its hold is not believed past the hold.
    assert await journal.settle_paid_jobs("p1", "gpu-1", Usage(10**6, 1e6))
    used = await journal.paid_usage("alice", since)
    assert used.paid_jobs == 8 and used.spend == pytest.approx(0.12 + 0.16 + 0.04)
    with pytest.raises(BudgetExceeded):  # this gateway's own jobs see the holds too
        for n in range(3):
            await journal.record_remote_job(paid(f"k{n}"), check(since, day))
    assert (await journal.paid_usage("bob", since)).paid_jobs == 0


async def test_a_new_grant_on_the_same_backend_replaces_the_hold_and_counts_what_was_spent(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    since = clock.now
    own = Budget(paid_jobs=5)
    first = await journal.hold_paid_jobs(hold_request(since, prompt_budget=own, wanted=Usage(2)))
    assert first.paid_jobs == 2
    await journal.settle_paid_jobs("p1", "gpu-1", Usage(2, 0.0))
    # Run again there (a retry): the backend's count for the prompt includes its 2 jobs.
    again = await journal.hold_paid_jobs(hold_request(since, prompt_budget=own, wanted=Usage(2)))
    assert again.paid_jobs == 4
    # On another backend the prompt has 5 - 4 held there.
    other = await journal.hold_paid_jobs(hold_request(since, backend="gpu-2", prompt_budget=own))
    assert other.paid_jobs == 1
    assert (await journal.paid_usage("alice", since)).paid_jobs == 5


@pytest.mark.parametrize("factory", STORES, indirect=True)
async def test_two_gateways_never_hold_more_than_a_tenants_budget(
    factory: StoreFactory, tmp_path: Path, clock: Clock
) -> None:
    a, b = factory(tmp_path, clock, owner="a"), factory(tmp_path, clock, owner="b")
    await a.open()
    await b.open()
    try:
        day = Budget(paid_jobs=7)
        grants = await asyncio.gather(
            *(
                store.hold_paid_jobs(
                    hold_request(clock.now, f"{store.owner}{n}", "gpu", day, wanted=Usage(2))
                )
                for n in range(6)
                for store in (a, b)
            )
        )
        assert sum(grant.paid_jobs or 0 for grant in grants) == 7
        assert (await b.paid_usage("alice", clock.now)).paid_jobs == 7
    finally:
        await a.close()
        await b.close()
