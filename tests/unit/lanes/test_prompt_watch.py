"""A prompt's watch frees its slot the moment the end event arrives, not when read."""

from __future__ import annotations

import json

import aiohttp

from comfyfleet.engine.events import Message
from comfyfleet.lanes.backend import BackendClient, BackendSpec


def frame(kind: str, prompt_id: str, **data: object) -> str:
    return json.dumps({"type": kind, "data": {"prompt_id": prompt_id, **data}})


async def test_on_end_runs_as_the_end_event_arrives() -> None:
    async with aiohttp.ClientSession() as session:
        client = BackendClient(BackendSpec(url="http://127.0.0.1:9", name="b"), session)
        ended: list[str] = []
        watch = client.watch("p1", on_end=lambda: ended.append("p1"))
        other = client.watch("p2", on_end=lambda: ended.append("p2"))

        client._on_text(frame("execution_start", "p1", timestamp=1))
        client._on_text(frame("executed", "p1", node="3", output={}))
        assert ended == []
        client._on_text(frame("execution_success", "p1", timestamp=2))
        assert ended == ["p1"]  # nothing has read the watch's queue yet
        assert watch.queue.qsize() == 3
        client._on_text(frame("execution_interrupted", "p2", node_id="2"))
        client._on_text(frame("executing", "p1", node=None))
        assert ended == ["p1", "p2"]
        events = [watch.queue.get_nowait() for _ in range(4)]
        assert [e.type for e in events if isinstance(e, Message)] == [
            "execution_start",
            "executed",
            "execution_success",
            "executing",
        ]
        assert other.queue.qsize() == 1


async def test_a_watch_without_on_end_just_queues() -> None:
    async with aiohttp.ClientSession() as session:
        client = BackendClient(BackendSpec(url="http://127.0.0.1:9", name="b"), session)
        watch = client.watch("p1")
        client._on_text(frame("execution_error", "p1", node_id="2"))
        event = watch.queue.get_nowait()
        assert isinstance(event, Message) and event.type == "execution_error"
