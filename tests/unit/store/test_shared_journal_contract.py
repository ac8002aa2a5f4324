"""The remote-job journal shared by several gateways (base.RemoteJobJournal), over every
store: two store objects on one set of data stand for gateways a and b. A request has
one live job, its owner's; another gateway waits on it, takes it over once the owner's
lease has run out, or is handed it when the owner no longer wants it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.domain.remote_jobs import RemoteJobState
from comfyfleet.store.base import JobStore
from tests.unit.store.stores import Clock, StoreFactory
from tests.unit.store.test_journal_contract import new
from tests.unit.store.test_leases_contract import LEASE, gateway


@pytest.fixture
async def pair(
    factory: StoreFactory, tmp_path: Path, clock: Clock
) -> AsyncIterator[tuple[JobStore, JobStore]]:
    """Gateways a and b, joined, on one store."""
    a, b = factory(tmp_path, clock, owner="a"), factory(tmp_path, clock, owner="b")
    await a.open()
    await b.open()
    await a.join(gateway("host-a"), LEASE)
    await b.join(gateway("host-b"), LEASE)
    yield a, b
    await a.close()
    await b.close()


async def a_dies(b: JobStore, clock: Clock) -> None:
    """a stops renewing its lease; b goes on."""
    clock.advance(LEASE + 1)
    assert await b.heartbeat(LEASE)


async def test_a_request_has_one_live_job_its_owners(pair: tuple[JobStore, JobStore]) -> None:
    a, b = pair
    mine = await a.record_remote_job(new("a1"))
    assert (mine.id, mine.owner, mine.state) == ("a1", "a", RemoteJobState.SUBMITTING)
    theirs = await b.record_remote_job(new("b1"))
    assert (theirs.id, theirs.owner) == ("a1", "a")  # nothing sent twice: b waits on a1
    assert await b.remote_job("b1") is None
    other = await b.record_remote_job(new("b2", "h2"))  # another request is b's own
    assert (other.id, other.owner) == ("b2", "b")
    await a.finish_remote_job("a1", RemoteJobState.FAILED)
    again = await b.record_remote_job(new("b3"))  # once a1 has ended, a new job may go
    assert (again.id, again.owner) == ("b3", "b")


async def test_gateways_recording_one_request_at_once_record_it_once(
    pair: tuple[JobStore, JobStore],
) -> None:
    a, b = pair
    recorded = await asyncio.gather(
        *(store.record_remote_job(new(f"{store.owner}{n}")) for n in range(10) for store in (a, b))
    )
    assert len({job.id for job in recorded}) == 1
    assert len(await a.live_remote_jobs()) + len(await b.live_remote_jobs()) == 1


async def test_writes_about_a_job_are_its_owners(pair: tuple[JobStore, JobStore]) -> None:
    a, b = pair
    await a.record_remote_job(new("a1"))
    assert not await b.remote_job_submitted("a1", "t-b", {})
    assert not await b.finish_remote_job("a1", RemoteJobState.CANCELLED)
    assert await a.remote_job_submitted("a1", "t-a", {"polling_url": "u"})
    assert await a.finish_remote_job("a1", RemoteJobState.SUCCEEDED, result=b"png")
    found = await b.remote_job("a1")
    assert found is not None and (found.remote_id, found.result) == ("t-a", b"png")


async def test_live_jobs_are_a_gateways_own_and_orphans(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.record_remote_job(new("a1", "h1"))
    await b.record_remote_job(new("b1", "h2"))
    assert [job.id for job in await a.live_remote_jobs()] == ["a1"]
    assert [job.id for job in await b.live_remote_jobs()] == ["b1"]
    await a_dies(b, clock)
    assert [job.id for job in await b.live_remote_jobs()] == ["a1", "b1"]


async def test_a_dead_owners_job_is_adopted_once_and_its_writes_refused(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.record_remote_job(new("a1"))
    await a.remote_job_submitted("a1", "t1", {"polling_url": "u"})
    assert await b.adopt_remote_job("a1") is None  # a is live: b leaves it alone
    mine = await a.adopt_remote_job("a1")  # one's own job is one's already
    assert mine is not None and mine.owner == "a"
    await a_dies(b, clock)
    taken = await b.adopt_remote_job("a1")
    assert taken is not None
    assert (taken.owner, taken.remote_id, taken.resume) == ("b", "t1", {"polling_url": "u"})
    assert await a.adopt_remote_job("a1") is None  # b is live now
    assert not await a.finish_remote_job("a1", RemoteJobState.CANCELLED)
    assert await b.finish_remote_job("a1", RemoteJobState.SUCCEEDED, result=b"png")
    assert await b.adopt_remote_job("a1") is None  # final


async def test_an_unwanted_job_goes_to_a_live_gateway_that_waits_on_it(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.record_remote_job(new("a1"))
    await a.remote_job_submitted("a1", "t1", {})
    await b.wait_on_remote_job("a1", True)
    assert not await a.release_remote_job("a1")  # handed to b: a does not cancel it
    found = await a.remote_job("a1")
    assert found is not None and (found.owner, found.state) == ("b", RemoteJobState.RUNNING)
    assert not await a.finish_remote_job("a1", RemoteJobState.CANCELLED)
    assert not await a.release_remote_job("a1")  # not a's any more
    assert await b.release_remote_job("a1")  # nobody else waits: b may cancel it
    assert await b.finish_remote_job("a1", RemoteJobState.CANCELLED)
    assert not await b.release_remote_job("a1")  # final


async def test_nobody_waiting_means_the_owner_cancels(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.record_remote_job(new("a1"))
    assert await a.release_remote_job("a1")
    await b.wait_on_remote_job("a1", True)
    await b.wait_on_remote_job("a1", False)  # b stopped waiting
    assert await a.release_remote_job("a1")
    await b.wait_on_remote_job("a1", True)
    clock.advance(LEASE + 1)  # b's lease ran out: its wait no longer counts
    assert await a.heartbeat(LEASE)
    assert await a.release_remote_job("a1")
    found = await a.remote_job("a1")
    assert found is not None and found.owner == "a"
