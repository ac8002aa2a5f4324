"""The pending limit holds for every gateway of a shared store together: a gateway's own
count misses the others' submits until its next recount, so the store counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.domain.jobs import JobStatus, NewJob
from comfyfleet.scheduler.scheduler import QueueFull, Scheduler
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.store.postgres import PostgresStore
from tests.postgres import schema_for

PROMPT = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 1}}}


def gateway(store: PostgresStore, max_pending: int) -> Scheduler:
    hub = Hub()
    return Scheduler(store, [], ClientRouter(hub, StatusBroadcaster(hub)), max_pending=max_pending)


async def test_two_gateways_never_queue_past_the_limit_between_recounts(
    postgres_url: str, tmp_path: Path
) -> None:
    schema = schema_for(tmp_path)
    stores = [PostgresStore(postgres_url, schema=schema, owner=name) for name in ("a", "b")]
    for store in stores:
        await store.open()
    first, second = gateway(stores[0], 3), gateway(stores[1], 3)
    try:
        for i in range(3):
            await first.submit(NewJob(f"a{i}", i, False, PROMPT, {}, ["1"]))
        assert second.state.pending == 0  # it has not recounted since
        with pytest.raises(QueueFull):
            await second.submit(NewJob("b0", 9, False, PROMPT, {}, ["1"]))
        assert (await stores[1].counts())[JobStatus.PENDING] == 3
        # A place freed elsewhere is seen at once, without a recount either.
        assert await first.delete_pending(["a0"]) == ["a0"]
        assert first.state.pending == 2
        second.state.pending = 3  # as a recount before the delete found it
        await second.submit(NewJob("b1", 10, False, PROMPT, {}, ["1"]))
        assert (await stores[1].counts())[JobStatus.PENDING] == 3
    finally:
        for store in stores:
            await store.close()
