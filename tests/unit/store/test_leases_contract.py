"""GatewayRecord leases (base.GatewayLeases), over every store: two store objects on one set of
data stand for two gateways. A job's lease is its owner's; once it runs out, another
gateway re-queues or adopts the job, and the old owner's writes are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.jobs import DispatchKey, Job, JobStatus
from comfyfleet.store.base import GatewayIdInUse, JobStore
from tests.unit.store.job_helpers import new_job, result
from tests.unit.store.stores import Clock, StoreFactory, claim_next, reserve_next

LEASE = 10.0


def gateway(host: str = "host-a", pid: int = 100) -> GatewayRecord:
    return GatewayRecord("ignored", "ignored", host, pid, "http://127.0.0.1:8188", 1.0)


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


async def claimed(store: JobStore, prompt_id: str, lane: str = "local") -> Job:
    await store.submit(new_job(prompt_id))
    job = await claim_next(store, lane)
    assert job is not None and job.prompt_id == prompt_id
    return job


async def test_every_way_of_starting_records_the_owner(pair: tuple[JobStore, JobStore]) -> None:
    a, b = pair
    job = await claimed(a, "claimed")
    assert job.owner == "a" and (await b.get("claimed")).owner == "a"  # type: ignore[union-attr]
    handed = await b.submit(new_job("handed"), claim_for="local")
    assert handed.owner == "b" and (await a.get("handed")).owner == "b"  # type: ignore[union-attr]
    await a.submit(new_job("reserved"))
    reserved = await reserve_next(a, "backend:x")
    assert reserved is not None and reserved.owner == "a"
    assert (await b.get("reserved")).owner == "a"  # type: ignore[union-attr]
    started = await b.start_reserved(reserved, "backend:x")
    assert started is not None and started.owner == "b"
    assert await a.requeue(job.prompt_id, job.attempt)
    assert (await b.get("claimed")).owner is None  # type: ignore[union-attr]


async def test_live_gateways_with_what_each_runs(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await claimed(a, "one")
    await claimed(a, "two")
    live = {g.id: g for g in await b.gateways()}
    assert set(live) == {"a", "b"}
    assert (live["a"].running, live["b"].running, live["a"].host) == (2, 0, "host-a")
    clock.advance(LEASE / 2)
    assert await b.heartbeat(LEASE)
    clock.advance(LEASE / 2 + 1)  # a's lease ran out, b's was renewed
    assert [g.id for g in await b.gateways()] == ["b"]
    await b.leave()
    assert await a.gateways() == []


async def test_a_held_id_is_refused_until_its_lease_runs_out(
    factory: StoreFactory, tmp_path: Path, clock: Clock, pair: tuple[JobStore, JobStore]
) -> None:
    a, _ = pair
    again = factory(tmp_path, clock, owner="a")
    await again.open()
    try:
        with pytest.raises(GatewayIdInUse, match="host-a") as refused:
            await again.join(gateway("host-c"), LEASE)
        assert (refused.value.holder.host, refused.value.holder.pid) == ("host-a", 100)
        with pytest.raises(GatewayIdInUse):
            await again.join(gateway("host-c"), LEASE, replace="some other instance")
        clock.advance(LEASE + 1)
        await again.join(gateway("host-c"), LEASE)  # the old instance stopped renewing
        assert not await a.heartbeat(LEASE)  # and knows it lost the id
        assert [(g.id, g.host) for g in await again.gateways()] == [("a", "host-c")]
    finally:
        await again.close()


async def test_a_dead_holder_can_be_replaced_at_once(
    factory: StoreFactory, tmp_path: Path, clock: Clock, pair: tuple[JobStore, JobStore]
) -> None:
    a, _ = pair
    again = factory(tmp_path, clock, owner="a")
    await again.open()
    try:
        with pytest.raises(GatewayIdInUse) as refused:
            await again.join(gateway("host-a", 200), LEASE)
        await again.join(gateway("host-a", 200), LEASE, replace=refused.value.holder.instance)
        assert [(g.id, g.pid) for g in await again.gateways()] == [("a", 200), ("b", 100)]
        assert not await a.heartbeat(LEASE)
    finally:
        await again.close()


async def test_orphans_are_requeued_or_adopted_and_the_old_owner_is_fenced(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    local = await claimed(a, "local-job", "local")
    remote = await claimed(a, "remote-job", "backend:x")
    assert await b.orphaned() == []  # a's lease holds
    clock.advance(LEASE + 1)
    assert await b.heartbeat(LEASE)
    assert [job.prompt_id for job in await b.orphaned()] == ["local-job", "remote-job"]

    assert await b.requeue_orphaned(local)
    assert not await b.requeue_orphaned(local)  # done once
    assert (await b.get("local-job")).status == JobStatus.PENDING  # type: ignore[union-attr]
    assert not await a.finish(local.prompt_id, local.attempt, result())

    adopted = await b.adopt(remote)
    assert adopted is not None and (adopted.attempt, adopted.owner) == (2, "b")
    assert await b.adopt(remote) is None  # b's now, not orphaned
    assert await b.orphaned() == []
    assert not await a.finish(remote.prompt_id, remote.attempt, result())
    assert await b.finish(remote.prompt_id, adopted.attempt, result())
    assert await b.attempt_notes("remote-job") == [(1, {"kind": "adopted", "from": "a"})]


async def test_a_gone_gateways_reservations_are_orphans_to_give_back(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.submit(new_job("set aside"))
    assert await reserve_next(a, "backend:x") is not None
    assert await b.orphaned() == []
    clock.advance(LEASE + 1)
    assert await b.heartbeat(LEASE)
    [orphan] = await b.orphaned()
    assert (orphan.status, orphan.lane, orphan.owner) == (JobStatus.PENDING, "backend:x", "a")
    await b.unreserve([orphan.prompt_id])
    assert await b.orphaned() == []
    job = await claim_next(b, "local")
    assert job is not None and job.prompt_id == "set aside"


async def test_requeue_lane_leaves_another_live_gateways_jobs_alone(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await claimed(a, "a-job")
    await claimed(b, "b-job")
    assert await b.requeue_lane("local") == ["b-job"]
    clock.advance(LEASE + 1)  # a stops renewing: its job is orphaned now
    assert await b.heartbeat(LEASE)
    assert await b.requeue_lane("local") == ["a-job"]


async def test_work_wakes_the_watchers(pair: tuple[JobStore, JobStore]) -> None:
    a, _ = pair
    woken: list[str] = []
    arrived = asyncio.Event()

    def wake(owner: str, _key: DispatchKey | None) -> None:
        woken.append(owner)
        arrived.set()

    await a.watch_work(wake)
    await a.submit(new_job("queued"))
    await asyncio.wait_for(arrived.wait(), 5)
    assert woken[0] == "a"
    arrived.clear()
    job = await claim_next(a, "local")
    assert job is not None
    assert await a.requeue(job.prompt_id, job.attempt)  # claimable again
    await asyncio.wait_for(arrived.wait(), 5)


async def test_the_first_fleet_key_stored_is_every_gateways(
    pair: tuple[JobStore, JobStore],
) -> None:
    a, b = pair
    first, second = await asyncio.gather(
        a.fleet_key("peer", b"a" * 32), b.fleet_key("peer", b"b" * 32)
    )
    assert first == second and first in (b"a" * 32, b"b" * 32)
    assert await b.fleet_key("peer", b"c" * 32) == first  # never replaced
    assert await a.fleet_key("other", b"d" * 32) == b"d" * 32  # one per name


async def test_file_counters_are_handed_out_once_for_every_gateway(
    pair: tuple[JobStore, JobStore],
) -> None:
    a, b = pair
    firsts = await asyncio.gather(
        *(store.reserve_file_counter("output/ComfyUI", 1, 2) for store in (a, b, a, b))
    )
    taken = sorted(n for first in firsts for n in (first, first + 1))
    assert taken == list(range(1, 9))  # no counter twice, none skipped
    assert await b.reserve_file_counter("output/ComfyUI", 50, 1) == 50  # the folder's floor
    assert await a.reserve_file_counter("output/ComfyUI", 1, 1) == 51  # never back
    assert await a.reserve_file_counter("output/other", 1, 1) == 1  # one count per key
