"""Backend ownership (base.BackendOwners), over every store: two or three store objects
on one set of data stand for gateways. A backend is owned by one live gateway at a
time, through that gateway's lease; its client id is the fleet's, kept across owners."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.domain.gateways import BackendOwner, GatewayRecord
from comfyfleet.store.base import JobStore
from tests.unit.store.stores import Clock, StoreFactory

LEASE = 10.0


def gateway() -> GatewayRecord:
    return GatewayRecord("ignored", "ignored", "host", 100, "http://127.0.0.1:8188", 1.0)


@pytest.fixture
async def trio(
    factory: StoreFactory, tmp_path: Path, clock: Clock
) -> AsyncIterator[tuple[JobStore, JobStore, JobStore]]:
    """Gateways a, b and c, joined, on one store."""
    stores = [factory(tmp_path, clock, owner=name) for name in "abc"]
    for store in stores:
        await store.open()
        await store.join(gateway(), LEASE)
    yield stores[0], stores[1], stores[2]
    for store in stores:
        await store.close()


def names(owners: list[BackendOwner]) -> list[str]:
    return [owner.backend for owner in owners]


OFFER = {"x": "client-a-x", "y": "client-a-y", "z": "client-a-z"}


async def test_a_backend_is_claimed_once_and_keeps_its_client_id(
    trio: tuple[JobStore, JobStore, JobStore],
) -> None:
    a, b, _ = trio
    held = await a.claim_backends(OFFER, limit=2)
    assert [(o.backend, o.client_id, o.owner) for o in held] == [
        ("x", "client-a-x", "a"),
        ("y", "client-a-y", "a"),
    ]
    # b offers its own client ids: the ones recorded first are every owner's.
    theirs = await b.claim_backends({"x": "client-b-x", "y": "b-y", "z": "client-b-z"})
    assert [(o.backend, o.client_id, o.owner) for o in theirs] == [("z", "client-b-z", "b")]
    assert names(await a.claim_backends(OFFER)) == ["x", "y"]  # held still, nothing new
    listed = await b.backend_owners()
    assert [(o.backend, o.owner) for o in listed] == [("x", "a"), ("y", "a"), ("z", "b")]


async def test_a_dead_gateways_backends_are_free_with_its_lease(
    trio: tuple[JobStore, JobStore, JobStore], clock: Clock
) -> None:
    a, b, c = trio
    await a.claim_backends(OFFER)
    clock.advance(LEASE / 2)
    assert await b.heartbeat(LEASE) and await c.heartbeat(LEASE)
    assert await b.claim_backends(OFFER) == []  # a's lease holds: nothing is free
    clock.advance(LEASE / 2 + 1)  # a's ran out
    assert [o.owner for o in await c.backend_owners()] == [None, None, None]
    assert names(await b.claim_backends(OFFER, limit=1)) == ["x"]
    taken = await c.claim_backends(OFFER)
    assert [(o.backend, o.client_id) for o in taken] == [("y", "client-a-y"), ("z", "client-a-z")]
    # a comes back: what it held is others' now, and it takes nothing while its lease
    # is out (fenced), even a backend that is free.
    await c.release_backends(["z"])
    assert await a.claim_backends(OFFER) == []
    assert await a.heartbeat(LEASE)
    assert names(await a.claim_backends(OFFER)) == ["z"]


async def test_a_lapsed_gateways_backends_wait_for_a_gateway_that_may_sweep(
    trio: tuple[JobStore, JobStore, JobStore], clock: Clock
) -> None:
    """After a store outage every lease has run out; a gateway back first may take what
    nobody owns, but not what a gateway about to renew still holds."""
    a, b, _ = trio
    await a.claim_backends({"x": "client-a-x"})
    clock.advance(LEASE + 1)
    assert await b.heartbeat(LEASE)
    assert await b.claim_backends(OFFER, take_lapsed=False) == [
        BackendOwner("y", "client-a-y", "b", clock()),
        BackendOwner("z", "client-a-z", "b", clock()),
    ]
    assert await a.heartbeat(LEASE)
    assert names(await a.claim_backends(OFFER)) == ["x"]  # still a's
    await a.release_backends(["x"])
    assert names(await b.claim_backends(OFFER, take_lapsed=False)) == ["x", "y", "z"]


async def test_an_owner_keeps_its_backends_while_its_lease_is_late(
    trio: tuple[JobStore, JobStore, JobStore], clock: Clock
) -> None:
    a, _, _ = trio
    await a.claim_backends(OFFER)
    clock.advance(LEASE + 1)  # nobody took them meanwhile: a renews and goes on
    assert names(await a.claim_backends(OFFER)) == ["x", "y", "z"]


async def test_release_frees_a_gateways_backends(
    trio: tuple[JobStore, JobStore, JobStore],
) -> None:
    a, b, _ = trio
    await a.claim_backends(OFFER)
    await a.release_backends(["x"])
    assert [(o.backend, o.owner) for o in await b.backend_owners()] == [
        ("x", None),
        ("y", "a"),
        ("z", "a"),
    ]
    await a.release_backends()
    assert names(await b.claim_backends(OFFER)) == ["x", "y", "z"]
    await b.leave()  # leaving frees them too: the lease is gone
    assert [o.owner for o in await a.backend_owners()] == [None, None, None]


async def test_concurrent_claims_never_share_a_backend(
    trio: tuple[JobStore, JobStore, JobStore],
) -> None:
    offer = {f"backend-{n}": f"client-{n}" for n in range(12)}
    for _ in range(3):
        results = await asyncio.gather(*(store.claim_backends(offer) for store in trio))
        claimed = [name for held in results for name in names(held)]
        assert sorted(claimed) == sorted(offer)  # each once, by exactly one gateway
        for store in trio:
            await store.release_backends()


async def test_a_deleted_backend_forgets_its_owner(
    trio: tuple[JobStore, JobStore, JobStore],
) -> None:
    a, b, _ = trio
    await a.save_backend("x", {"url": "http://127.0.0.1:9", "name": "x"})
    await a.claim_backends({"x": "old-client"})
    assert await b.delete_backend("x")
    assert await a.backend_owners() == []
    held = await b.claim_backends({"x": "new-client"})
    assert [(o.backend, o.client_id) for o in held] == [("x", "new-client")]
