"""Published node sets (seams/published_nodes.py), over every store: gateways a and b
on one store. A lane's entry is its gateway's, seen by the others while that gateway's
lease holds; a node set is kept once, and goes a minute after no lane has it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from comfyfleet.store.base import JobStore
from tests.unit.store.stores import Clock, StoreFactory
from tests.unit.store.test_backend_owners_contract import LEASE, gateway

SET_1, SET_2 = b'{"object_info":{"A":{}},"models":{}}', b'{"object_info":{"B":{}},"models":{}}'


@pytest.fixture
async def pair(
    factory: StoreFactory, tmp_path: Path, clock: Clock
) -> AsyncIterator[tuple[JobStore, JobStore]]:
    stores = [factory(tmp_path, clock, owner=name) for name in "ab"]
    for store in stores:
        await store.open()
        await store.join(gateway(), LEASE)
    yield stores[0], stores[1]
    for store in stores:
        await store.close()


async def test_a_gateway_sees_the_lanes_the_others_published(
    pair: tuple[JobStore, JobStore],
) -> None:
    a, b = pair
    await a.publish_nodes("backend:worker-x.1", "d1", SET_1)
    await a.publish_nodes("backend:worker-x.2", "d1", SET_1)  # the same set: kept once
    await b.publish_nodes("backend:worker-y", "d2", SET_2)
    assert await b.nodes_elsewhere() == {"backend:worker-x.1": "d1", "backend:worker-x.2": "d1"}
    assert await a.nodes_elsewhere() == {"backend:worker-y": "d2"}  # not its own
    assert await b.node_set("d1") == SET_1
    assert await b.node_set("nothing") is None
    await a.publish_nodes("backend:worker-x.2", "d2", SET_2)  # its nodes changed
    assert await b.nodes_elsewhere() == {"backend:worker-x.1": "d1", "backend:worker-x.2": "d2"}


async def test_an_unpublished_lane_goes_and_its_set_a_minute_after_the_last_lane(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.publish_nodes("backend:worker-x", "d1", SET_1)
    await b.unpublish_nodes("backend:worker-x")  # not b's lane: nothing happens
    assert await b.nodes_elsewhere() == {"backend:worker-x": "d1"}
    await a.unpublish_nodes("backend:worker-x")
    assert await b.nodes_elsewhere() == {}
    assert await b.node_set("d1") == SET_1  # a gateway may be publishing it again now
    clock.advance(61)
    await a.heartbeat(LEASE)
    await a.unpublish_nodes("backend:other")  # any change tidies up
    assert await b.node_set("d1") is None


async def test_the_lanes_of_a_gateway_whose_lease_ran_out_are_not_counted(
    pair: tuple[JobStore, JobStore], clock: Clock
) -> None:
    a, b = pair
    await a.publish_nodes("backend:worker-x", "d1", SET_1)
    clock.advance(LEASE + 1)  # a stopped renewing its lease
    await b.heartbeat(LEASE)
    assert await b.nodes_elsewhere() == {}
    clock.advance(60)
    await b.heartbeat(LEASE)
    await b.publish_nodes("backend:worker-y", "d2", SET_2)  # tidies up what a left
    assert await b.node_set("d1") is None
    assert await b.node_set("d2") == SET_2
