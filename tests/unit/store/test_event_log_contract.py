"""The prompt event log contract (append, read after an id, prune), run against every
store (conftest.py). Only the public interface is used."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from comfyfleet.domain.prompt_events import (
    PAGE_FRAME_BYTES,
    EventsAppended,
    NewPromptEvent,
    PromptEvent,
    more_after,
)
from comfyfleet.store.base import JobStore
from comfyfleet.store.event_wakeups import client_digest
from tests.unit.store.job_helpers import new_job, result
from tests.unit.store.stores import Clock, claim_next


def event(prompt_id: str, index: int, kind: str = "progress") -> NewPromptEvent:
    return NewPromptEvent(prompt_id, kind, {"prompt_id": prompt_id, "value": index})


def done(prompt_id: str) -> NewPromptEvent:
    return NewPromptEvent(prompt_id, "executing", {"node": None, "prompt_id": prompt_id})


async def test_appended_events_come_back_in_order_with_growing_ids(
    store: JobStore, clock: Clock
) -> None:
    appended = await store.append_prompt_events([event("p1", 0), event("p2", 0), event("p1", 1)])
    ids = [e.id for e in appended]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert all(e.at == clock.now for e in appended)
    more = await store.append_prompt_events([event("p1", 2), done("p1")])
    assert more[0].id > ids[-1] and more[1].id > more[0].id
    assert more[1].done and not more[0].done

    read = await store.prompt_events("p1")
    assert read == [appended[0], appended[2], *more]
    assert [e.data["value"] for e in read[:3]] == [0, 1, 2]
    assert await store.prompt_events("p2") == [appended[1]]
    assert await store.prompt_events("unknown") == []
    assert await store.append_prompt_events([]) == []


async def test_reads_resume_after_an_id_and_are_paged(store: JobStore) -> None:
    appended = await store.append_prompt_events([event("p", i) for i in range(7)])
    assert await store.prompt_events("p", after=appended[2].id) == appended[3:]
    assert await store.prompt_events("p", after=appended[2].id, limit=2) == appended[3:5]
    assert await store.prompt_events("p", after=appended[-1].id) == []
    assert await store.prompt_events("p", limit=0) == []


async def test_any_text_and_json_round_trip(store: JobStore) -> None:
    prompt_id = "p\x00\x01é\U0001f600"
    data: dict[str, Any] = {"text": "a\x00b\u2028", "nested": {"list": [1, 2.5, None, True]}}
    (appended,) = await store.append_prompt_events([NewPromptEvent(prompt_id, "ty\x00pe", data)])
    assert await store.prompt_events(prompt_id) == [
        PromptEvent(appended.id, prompt_id, "ty\x00pe", data, appended.at)
    ]
    assert await store.prompt_events("p") == []  # a prefix is another prompt


async def test_binary_frames_are_kept_byte_for_byte_among_the_json_frames(store: JobStore) -> None:
    every_byte = bytes(range(256)) * 3
    appended = await store.append_prompt_events(
        [
            event("p", 0),
            NewPromptEvent("p", "preview_image", {"node_id": "3", "format": "PNG"}, every_byte),
            NewPromptEvent("p", "progress_text", {"node_id": "3"}, "é\x00ok".encode()),
            NewPromptEvent("p", "progress_text", {"node_id": "3"}, b""),  # empty, not JSON
            event("p", 1),
            done("p"),
        ]
    )
    read = await store.prompt_events("p")
    assert read == appended
    assert [e.frame for e in read] == [None, every_byte, "é\x00ok".encode(), b"", None, None]
    assert [e.done for e in read] == [False] * 5 + [True]
    # Resuming between binary frames.
    assert await store.prompt_events("p", after=appended[1].id, limit=2) == appended[2:4]


async def test_a_page_ends_once_its_frames_reach_the_byte_budget(store: JobStore) -> None:
    third = PAGE_FRAME_BYTES // 3 + 1
    big = [NewPromptEvent("p", "preview_image", {"n": i}, bytes([i]) * third) for i in range(5)]
    appended = await store.append_prompt_events([event("p", 0), *big, event("p", 1)])
    page = await store.prompt_events("p")
    # Three frames reach the budget: the page ends after the third, and says so.
    assert page == appended[:4]
    assert more_after(page, 500)
    rest = await store.prompt_events("p", after=page[-1].id)
    assert rest == appended[4:]
    assert not more_after(rest, 500)
    # A single frame over the budget still comes, alone.
    (huge,) = await store.append_prompt_events(
        [NewPromptEvent("q", "preview_image", {}, b"x" * (PAGE_FRAME_BYTES + 1))]
    )
    await store.append_prompt_events([event("q", 0)])
    assert await store.prompt_events("q") == [huge]


async def test_ids_are_never_reused_after_a_prune_or_a_reopen(
    store: JobStore, clock: Clock, reopen: Callable[[JobStore], Any]
) -> None:
    first = await store.append_prompt_events([event("gone", 0), done("gone")])
    clock.advance(100)
    assert await store.prune_prompt_events(clock.now - 10) == 2
    again = await store.append_prompt_events([event("next", 0)])
    assert again[0].id > first[-1].id
    store = await reopen(store)
    try:
        later = await store.append_prompt_events([event("next", 1)])
        assert later[0].id > again[0].id
        assert [e.id for e in await store.prompt_events("next")] == [again[0].id, later[0].id]
    finally:
        await store.close()


async def test_prune_deletes_prompts_that_ended_before_the_cutoff(
    store: JobStore, clock: Clock
) -> None:
    await store.append_prompt_events([event("old", 0), done("old")])
    clock.advance(50)
    # Began before the cutoff but its newest event is recent: kept whole.
    await store.append_prompt_events([event("spanning", 0)])
    clock.advance(50)
    await store.append_prompt_events([done("spanning"), event("new", 0)])
    clock.advance(10)

    assert await store.prune_prompt_events(clock.now - 30) == 2
    assert await store.prompt_events("old") == []
    assert len(await store.prompt_events("spanning")) == 2
    assert len(await store.prompt_events("new")) == 1
    assert await store.prune_prompt_events(clock.now - 30) == 0


async def test_prune_keeps_the_events_of_pending_and_running_jobs(
    store: JobStore, clock: Clock
) -> None:
    for prompt_id in ("running", "finished", "pending"):
        await store.submit(new_job(prompt_id))
        await store.append_prompt_events([event(prompt_id, 0)])
    running = await claim_next(store, "lane")
    finished = await claim_next(store, "lane")
    assert running is not None and finished is not None
    assert (running.prompt_id, finished.prompt_id) == ("running", "finished")
    assert await store.finish(finished.prompt_id, finished.attempt, result())
    clock.advance(3600)

    assert await store.prune_prompt_events(clock.now - 60) == 1
    assert len(await store.prompt_events("running")) == 1
    assert len(await store.prompt_events("pending")) == 1
    assert await store.prompt_events("finished") == []


async def woken_by(store: JobStore) -> list[EventsAppended]:
    """Watch the store's appends; the list fills as wake-ups arrive (see `arrived`)."""
    found: list[EventsAppended] = []
    await store.watch_events(found.append)
    return found


async def arrived(found: list[EventsAppended], count: int) -> list[EventsAppended]:
    async with asyncio.timeout(10):
        while len(found) < count:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # no more than that
    return found


async def test_each_append_wakes_each_prompt_with_its_clients_digest(store: JobStore) -> None:
    client = "c\x00\x01é"  # digested as the database stores it
    await store.submit(new_job("with-client", client_id=client, tenant="acme"))
    await store.submit(new_job("without-client"))
    found = await woken_by(store)
    await store.append_prompt_events(
        [event("with-client", 0), event("without-client", 0), event("with-client", 1)]
    )
    await store.append_prompt_events([event("unknown", 0)])
    assert sorted(await arrived(found, 3), key=str) == sorted(
        [
            EventsAppended("with-client", client_digest("acme", client), ours=True),
            EventsAppended("without-client", None, ours=True),
            EventsAppended("unknown", None, ours=True),
        ],
        key=str,
    )
    assert client_digest("acme", client) != client_digest("default", client)
    assert client_digest("a", "bc") != client_digest("ab", "c")
