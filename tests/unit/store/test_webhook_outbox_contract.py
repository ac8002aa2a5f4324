"""The webhook outbox contract, run against every store (conftest.py): deliveries are
recorded with the job's end, claimed under a lease, and kept until pruned."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from comfyfleet.domain.jobs import JobStatus
from comfyfleet.domain.webhooks import (
    DeliveryAttempt,
    DeliveryState,
    WebhookEvent,
    WebhookTarget,
)
from comfyfleet.store.base import JobStore
from tests.unit.store.job_helpers import new_job, result
from tests.unit.store.stores import Clock, claim_next

HOOK = "https://hooks.example.com/in"


def hooked(prompt_id: str, number: float = 1, **extra: Any) -> Any:
    return new_job(prompt_id, number, extra_data={"webhook_url": HOOK, **extra})


async def end(store: JobStore, status: JobStatus = JobStatus.SUCCESS) -> str:
    job = await claim_next(store, "lane")
    assert job is not None
    assert await store.finish(job.prompt_id, job.attempt, result(status))
    return job.prompt_id


async def all_deliveries(store: JobStore, **kw: Any) -> list[Any]:
    found, total = await store.webhook_deliveries(limit=1000, **kw)
    assert total == len(found)
    return found


async def test_a_job_end_records_a_delivery_to_its_own_webhook(
    store: JobStore, clock: Clock
) -> None:
    await store.submit(hooked("p1"))
    await store.submit(new_job("p2", 2, extra_data={"note": "no webhook_url here"}))
    await end(store)
    await end(store, JobStatus.ERROR)
    [delivery] = await all_deliveries(store)
    assert (delivery.prompt_id, delivery.event, delivery.url) == ("p1", "job.succeeded", HOOK)
    assert delivery.target is None and delivery.tenant == "default"
    assert delivery.state == DeliveryState.PENDING and delivery.attempts == 0
    assert delivery.created_at == delivery.next_at == clock.now
    assert delivery.id.startswith("msg_") and delivery.body is None
    assert await store.webhook_delivery(delivery.id) == delivery


async def test_each_end_raises_its_event_and_webhook_events_filters(store: JobStore) -> None:
    await store.submit(hooked("ok", 1))
    await store.submit(hooked("bad", 2, webhook_events=["job.succeeded"]))
    await store.submit(hooked("stopped", 3, webhook_events=["job.interrupted"]))
    await store.submit(hooked("waiting", 4))
    await store.submit(hooked("dropped", 5, webhook_events=["job.failed"]))
    await end(store)
    await end(store, JobStatus.ERROR)  # it wants job.succeeded only: nothing
    await end(store, JobStatus.INTERRUPTED)
    assert await store.cancel(["waiting"], pending_only=True) == ["waiting"]
    assert await store.cancel_all_pending() == ["dropped"]  # wants job.failed only
    found = {d.prompt_id: d.event for d in await all_deliveries(store)}
    assert found == {
        "ok": WebhookEvent.SUCCEEDED,
        "stopped": WebhookEvent.INTERRUPTED,
        "waiting": WebhookEvent.CANCELLED,
    }


async def test_cancelling_running_and_clearing_the_queue_record_deliveries(
    store: JobStore,
) -> None:
    await store.submit(hooked("running", 1))
    await store.submit(hooked("queued", 2))
    assert await claim_next(store, "lane") is not None
    assert await store.cancel(["running"], pending_only=False) == ["running"]
    assert await store.cancel_all_pending() == ["queued"]
    found = await all_deliveries(store)
    assert sorted((d.prompt_id, d.event) for d in found) == [
        ("queued", "job.cancelled"),
        ("running", "job.cancelled"),
    ]


async def test_a_stale_finish_records_no_delivery(store: JobStore) -> None:
    await store.submit(hooked("p1"))
    job = await claim_next(store, "lane")
    assert job is not None
    assert await store.finish("p1", job.attempt, result())
    assert not await store.finish("p1", job.attempt, result(JobStatus.ERROR))
    assert len(await all_deliveries(store)) == 1


async def test_server_wide_targets_match_by_event_and_tenant(store: JobStore) -> None:
    await store.set_webhook_targets(
        [
            WebhookTarget("all", "https://a.example/h"),
            WebhookTarget(
                "failures", "https://f.example/h", events=frozenset({WebhookEvent.FAILED})
            ),
            WebhookTarget("acme", "https://acme.example/h", tenants=frozenset({"acme"})),
        ]
    )
    await store.submit(new_job("p1", 1))
    await store.submit(new_job("p2", 2, tenant="acme"))
    await store.submit(hooked("p3", 3))
    await end(store)
    await end(store, JobStatus.ERROR)
    await end(store)
    found = sorted((d.prompt_id, d.target or "-", d.url) for d in await all_deliveries(store))
    assert found == [
        ("p1", "all", "https://a.example/h"),
        ("p2", "acme", "https://acme.example/h"),
        ("p2", "all", "https://a.example/h"),
        ("p2", "failures", "https://f.example/h"),
        ("p3", "-", HOOK),
        ("p3", "all", "https://a.example/h"),
    ]
    assert {d.tenant for d in await all_deliveries(store, prompt_id="p2")} == {"acme"}
    await store.set_webhook_targets([])  # replaced: the next ends match nothing
    await store.submit(new_job("p4", 4))
    await end(store)
    assert await all_deliveries(store, prompt_id="p4") == []


async def test_a_claim_leases_deliveries_until_the_lease_ends(
    store: JobStore, clock: Clock
) -> None:
    for number in range(3):
        await store.submit(hooked(f"p{number}", number))
        await end(store)
    first = await store.claim_webhook_deliveries(2, lease_seconds=30)
    assert [d.prompt_id for d in first] == ["p0", "p1"]
    assert all(d.lease for d in first)
    second = await store.claim_webhook_deliveries(5, lease_seconds=30)
    assert [d.prompt_id for d in second] == ["p2"]
    assert await store.claim_webhook_deliveries(5, lease_seconds=30) == []
    clock.advance(31)  # the claimers died: their deliveries are due again
    again = await store.claim_webhook_deliveries(5, lease_seconds=30)
    assert sorted(d.prompt_id for d in again) == ["p0", "p1", "p2"]
    assert {d.id for d in again} == {d.id for d in first + second}
    # An old lease no longer records anything.
    assert not await store.record_webhook_attempt(
        first[0].id, first[0].lease or "", DeliveryAttempt(True, "{}", 200)
    )


async def test_a_released_delivery_is_due_again_with_no_attempt_counted(
    store: JobStore, clock: Clock
) -> None:
    await store.submit(hooked("p1"))
    await end(store)
    [claimed] = await store.claim_webhook_deliveries(1, 30)
    assert await store.release_webhook_delivery(claimed.id, claimed.lease or "", clock.now + 2)
    assert not await store.release_webhook_delivery(claimed.id, claimed.lease or "", clock.now)
    assert await store.claim_webhook_deliveries(1, 30) == []
    clock.advance(2)
    [again] = await store.claim_webhook_deliveries(1, 30)
    assert again.id == claimed.id and again.attempts == 0


async def test_attempts_are_recorded_and_the_first_body_is_kept(
    store: JobStore, clock: Clock
) -> None:
    await store.submit(hooked("p1"))
    await end(store)
    [claimed] = await store.claim_webhook_deliveries(1, 30)
    assert claimed.lease is not None
    failed = DeliveryAttempt(False, '{"first": 1}', 500, "HTTP 500", next_at=clock.now + 5)
    assert await store.record_webhook_attempt(claimed.id, claimed.lease, failed)
    assert await store.claim_webhook_deliveries(1, 30) == []  # not due yet
    clock.advance(5)
    [again] = await store.claim_webhook_deliveries(1, 30)
    assert (again.attempts, again.body, again.last_status) == (1, '{"first": 1}', 500)
    assert again.last_error == "HTTP 500"
    assert again.lease is not None and again.lease != claimed.lease
    done = DeliveryAttempt(True, '{"second": 2}', 204)
    assert await store.record_webhook_attempt(again.id, again.lease, done)
    found = await store.webhook_delivery(again.id)
    assert found is not None
    assert (found.state, found.attempts, found.delivered_at) == ("delivered", 2, clock.now)
    assert found.body == '{"first": 1}' and found.lease is None
    assert await store.claim_webhook_deliveries(1, 30) == []


async def test_a_dead_letter_is_listed_and_retried_by_id(store: JobStore, clock: Clock) -> None:
    for number in range(2):
        await store.submit(hooked(f"p{number}", number))
        await end(store)
    claimed = await store.claim_webhook_deliveries(2, 30)
    dead = DeliveryAttempt(False, "{}", None, "ConnectionRefusedError")
    for delivery in claimed:
        assert await store.record_webhook_attempt(delivery.id, delivery.lease or "", dead)
    assert await store.claim_webhook_deliveries(2, 30) == []
    listed, total = await store.webhook_deliveries(state=DeliveryState.DEAD, limit=1)
    assert total == 2 and [d.prompt_id for d in listed] == ["p1"]  # newest first
    assert [d.prompt_id for d in (await store.webhook_deliveries(limit=1, offset=1))[0]] == ["p0"]
    assert await store.webhook_deliveries(state=DeliveryState.PENDING) == ([], 0)
    clock.advance(60)
    retried = await store.retry_webhook_delivery(listed[0].id)
    assert retried is not None
    assert (retried.state, retried.next_at, retried.retry_since) == (
        "pending",
        clock.now,
        clock.now,
    )
    assert await store.retry_webhook_delivery(listed[0].id) is None  # already pending
    assert await store.retry_webhook_delivery("msg_unknown") is None
    [due] = await store.claim_webhook_deliveries(5, 30)
    assert due.id == listed[0].id and due.attempts == 1


async def test_two_claimers_never_get_one_delivery(store: JobStore) -> None:
    for number in range(40):
        await store.submit(hooked(f"p{number}", number))
        await end(store)
    batches = await asyncio.gather(*(store.claim_webhook_deliveries(3, 30) for _ in range(20)))
    ids = [d.id for batch in batches for d in batch]
    assert len(ids) == len(set(ids)) == 40


async def test_deliveries_outlive_restarts_and_retention(
    store: JobStore, clock: Clock, reopen: Callable[[JobStore], Any]
) -> None:
    await store.submit(hooked("p1"))
    await end(store)
    store = await reopen(store)
    try:
        clock.advance(10)
        await store.prune_history(max_entries=0, max_age_seconds=None)
        assert await store.get("p1") is None
        [delivery] = await store.claim_webhook_deliveries(5, 30)
        assert delivery.prompt_id == "p1"
        done = DeliveryAttempt(True, "{}", 200)
        assert await store.record_webhook_attempt(delivery.id, delivery.lease or "", done)
        clock.advance(10)
        assert await store.prune_webhook_deliveries(clock.now - 20) == 0
        assert await store.prune_webhook_deliveries(clock.now - 5) == 1
        assert await all_deliveries(store) == []
    finally:
        await store.close()


async def test_odd_webhook_fields_never_break_a_job_end(store: JobStore) -> None:
    """extra_data stored before webhooks were checked at submit may hold anything."""
    odd = [
        {"webhook_url": 5},
        {"webhook_url": None},
        {"webhook_url": "http://x.example/\x00nul"},
        {"webhook_url": HOOK, "webhook_events": "job.succeeded"},
        {"webhook_url": HOOK, "webhook_events": [1, None, {"a": "b"}, "job.succeeded"]},
        {"other": "\x00", "webhook_url": HOOK},
    ]
    for number, extra in enumerate(odd):
        await store.submit(new_job(f"p{number}", number, extra_data=extra))
        await end(store)
    # A NUL anywhere in extra_data: no own webhook (POST /prompt refuses such a prompt).
    assert sorted(d.prompt_id for d in await all_deliveries(store)) == ["p3", "p4"]
