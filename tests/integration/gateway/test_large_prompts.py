"""One large prompt costs the gateway in proportion to its size: no client waits on the
event loop while it is checked, started and run, and its event log grows by what
happened (each node's changes), not by ComfyUI's whole `progress_state` frames, which
list every started node each time (O(N²) bytes for N nodes).

Its followers still get the whole frames, exactly as a client connected while it ran."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway.test_follow import sse, stream_of
from tests.integration.gateway.test_limits import wide_prompt
from tests.integration.gateway.wire import Served, serve

pytestmark = pytest.mark.timeout(300)

#: Bytes of event log per node of the prompt the log may take (the issue's bound).
LOG_BYTES_PER_NODE = 2048


async def longest_wait(served: Served, until: asyncio.Event) -> float:
    """The longest `GET /prompt` while a prompt runs (every 50 ms): the event loop's
    longest stall, as a client sees it (the server runs on this loop)."""
    longest = 0.0
    while not until.is_set():
        asked = time.perf_counter()
        await served.get("/prompt")
        longest = max(longest, time.perf_counter() - asked)
        await asyncio.sleep(0.05)
    return longest


async def logged_bytes(served: Served, prompt_id: str) -> int:
    events = await served.gateway.store.prompt_events(prompt_id, limit=1_000_000)
    return sum(len(json.dumps(e.data)) + len(e.frame or b"") for e in events)


async def test_a_wide_prompt_logs_its_changes_and_stalls_no_client(tmp_path: Path) -> None:
    pairs = 1_000  # 2,000 nodes: 637 MB of log and 2.9 s stalls when frames were kept whole
    async with serve(tmp_path, local_slots=2) as served:
        ended = asyncio.Event()
        poller = asyncio.create_task(longest_wait(served, ended))
        await asyncio.sleep(0.1)
        reply = await served.post("/prompt", {"prompt": wide_prompt(pairs)})
        assert reply.status == 200, reply.text
        prompt_id = reply.json["prompt_id"]
        entry = await served.wait_history(prompt_id, timeout=120)
        ended.set()
        longest = await poller
        assert entry["status"]["status_str"] == "success"
        assert len(entry["outputs"]) == pairs

        size = await logged_bytes(served, prompt_id)
        assert size <= LOG_BYTES_PER_NODE * 2 * pairs, f"{size / (2 * pairs):.0f} B/node"
        assert longest < 1.5, f"a client waited {longest:.2f} s"  # generous: ~0.05 s here

        # A follower gets ComfyUI's whole frames back: the last lists every node, done.
        events = await sse(served, prompt_id)
        states = [e.data for e in events if e.event == "progress_state"]
        assert len(states) == 4 * pairs  # each node's start and finish
        last = states[-1]["nodes"]
        assert len(last) == 2 * pairs and {n["state"] for n in last.values()} == {"finished"}
        assert [len(s["nodes"]) for s in states[:3]] == [1, 1, 2]
        # One that resumes in the middle gets the whole frame there too.
        middle = next(e for e in events[len(events) // 2 :] if e.event == "progress_state")
        resumed = await sse(served, prompt_id, **{"Last-Event-ID": str(middle.id - 1)})
        assert resumed[0].data == middle.data


async def test_a_client_connected_to_a_prompt_gets_the_same_whole_frames_as_a_follower(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(wide_prompt(60), sock.client_id)
        await sock.done(prompt_id)
        live = stream_of(sock, prompt_id)
        states: list[Any] = [data for kind, data in live if kind == "progress_state"]
        assert len(states) == 240 and len(states[-1]["nodes"]) == 120
        logged = await sse(served, prompt_id)
        assert [(e.event, e.data) for e in logged] == live


async def test_a_deep_queue_of_large_prompts_is_listed_whole_without_stalling_clients(
    tmp_path: Path,
) -> None:
    """`GET /queue` of megabytes: every item as ComfyUI lists it, encoded a prompt at a
    time off the loop (measured here: the longest `GET /prompt` meanwhile 0.06 s against
    0.2 s when the queue was encoded in one piece)."""
    async with serve(tmp_path, local_slots=1) as served:
        blocker = {"1": {"class_type": "TestSleep", "inputs": {"value": 1, "seconds": 60}}}
        blocker["2"] = {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
        running = (await served.post("/prompt", {"prompt": blocker})).json["prompt_id"]
        sent = {}
        for n in range(12):
            prompt = wide_prompt(2_000)
            prompt["p0"]["inputs"]["value"] = n
            reply = await served.post("/prompt", {"prompt": prompt, "extra_data": {"n": n}})
            assert reply.status == 200, reply.text
            sent[reply.json["prompt_id"]] = prompt
        ended = asyncio.Event()
        poller = asyncio.create_task(longest_wait(served, ended))
        await asyncio.sleep(0.1)
        for _ in range(3):
            queue = await served.get("/queue")
        ended.set()
        longest = await poller
        assert [item[1] for item in queue["queue_running"]] == [running]
        assert [item[1] for item in queue["queue_pending"]] == list(sent)
        for number, prompt_id, prompt, extra_data, outputs in queue["queue_pending"]:
            assert prompt == sent[prompt_id]
            assert extra_data["n"] == prompt["p0"]["inputs"]["value"]
            assert isinstance(number, int) and len(outputs) == 2_000
        assert longest < 1.0, f"a client waited {longest:.2f} s"  # generous: ~0.06 s here
        await served.post("/interrupt", {})
