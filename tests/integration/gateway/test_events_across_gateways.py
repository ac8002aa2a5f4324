"""A client's frames cross gateways: its WebSocket on gateway A gets every frame of its
prompts that gateway B runs (two in-process gateways on one PostgreSQL), JSON and binary
(previews, progress text), the same and in the same order as a socket of the same client
on B, with reconnect catch-up, and after A's listening connection was cut."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from comfyfleet.protocol import frames
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.gateway import Gateway
from comfyfleet.store.postgres import LISTENER_NAME
from tests.integration.gateway.wire import (
    Received,
    Served,
    Socket,
    binary_prompt,
    client_frames,
    poll,
    preview_prompt,
    serve,
    sleep_prompt,
)

pytestmark = pytest.mark.timeout(120)

STREAM = ["execution_start", "execution_cached", "executing", "progress", "executed"]


@asynccontextmanager
async def two_gateways(tmp_path: Path, url: str) -> AsyncIterator[tuple[Served, Served]]:
    """B runs every prompt: A's only slot is taken (before B starts) for good. A gateway
    without slots would refuse prompts (no lane could run them)."""
    async with serve(tmp_path / "a", local_slots=1, store=url) as a:
        blocked = await a.connect()
        blocker = await a.submit(sleep_prompt(600, 9), blocked.client_id)
        await blocked.progress(blocker, "2")
        async with serve(tmp_path / "b", local_slots=2, store=url) as b:
            yield a, b


def json_frames(sock: Socket, prompt_id: str, after: int = 0) -> list[tuple[str, Any]]:
    return [(f.type, f.data) for f in sock.of_prompt(prompt_id)[after:] if f.type != "binary"]


def status_before_done(sock: Socket, prompt_id: str) -> int:
    """The queue count of the last `status` between the prompt's end event and its done
    signal (as ComfyUI sends them: end event, status, done signal)."""
    done = next(i for i, f in enumerate(sock.frames) if f.is_done(prompt_id))
    end = max(
        i
        for i, f in enumerate(sock.frames[:done])
        if f.type == "execution_success" and f.prompt_id == prompt_id
    )
    counts = [
        f.data["status"]["exec_info"]["queue_remaining"]
        for f in sock.frames[end:done]
        if f.type == "status"
    ]
    assert counts, [f.describe() for f in sock.frames[end : done + 1]]
    return int(counts[-1])


async def listener_of(gateway: Gateway, url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        pid: int = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = $1",
            f"{LISTENER_NAME} {gateway.store.owner}"[:63],
        )
        return pid
    finally:
        await conn.close()


async def test_a_clients_prompts_run_elsewhere_reach_it_as_from_the_gateway_running_them(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        on_a = await a.connect("client-x")
        on_b = await b.connect("client-x")  # the same client on the running gateway
        # The first runs long enough that the third is queued before it ends, however
        # slow the submits are, and the third longer still: the count at the first's end
        # includes the third.
        seconds = [1.5, 0.4, 3.0]
        ids = [
            await server.submit(sleep_prompt(seconds[n], n), "client-x")
            for n, server in enumerate([a, b, a])
        ]
        for prompt_id in ids:
            await on_a.done(prompt_id)
            await on_b.done(prompt_id)
        for prompt_id in ids:
            assert (await a.job(prompt_id))["gateway"] == b.gateway.store.owner
            relayed = json_frames(on_a, prompt_id)
            assert relayed == json_frames(on_b, prompt_id)  # none lost, none twice, in order
            types = [kind for kind, _ in relayed]
            assert all(kind in types for kind in STREAM)
            assert types[-2:] == ["execution_success", "executing"]
            status_before_done(on_a, prompt_id)
        # The counts before the done signals are the whole fleet's, read from the store:
        # at the first, A's blocker and the third prompt (waiting for, or in, a slot of
        # B's), which A's own view would not count; at the last, A's blocker alone.
        assert status_before_done(on_a, ids[0]) >= 2
        assert status_before_done(on_a, ids[-1]) == 1


async def test_previews_and_progress_text_cross_byte_for_byte_in_order(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        # Code 1 previews (after their `progress`) and code 4 (with metadata, before it).
        sockets = {
            (server.url, metadata): await server.connect("client-v", preview_metadata=metadata)
            for server in (a, b)
            for metadata in (False, True)
        }
        ids = []
        for n, server in enumerate([a, b]):  # one after the other: code 1 and 3 name no prompt
            ids.append(await server.submit(binary_prompt(n), "client-v"))
            for sock in sockets.values():
                await sock.done(ids[-1])
        for metadata in (False, True):
            on_a, on_b = sockets[a.url, metadata], sockets[b.url, metadata]
            relayed, running = client_frames(on_a), client_frames(on_b)
            assert [f.describe() for f in relayed] == [f.describe() for f in running]
            assert relayed == running  # every frame, its bytes and its place: none lost or twice
            binary = [f.data for f in relayed if f.type == "binary"]
            codes = [f.event_code for f in binary]
            preview_code = frames.PREVIEW_IMAGE_WITH_METADATA if metadata else frames.PREVIEW_IMAGE
            assert codes.count(preview_code) == 3 * len(ids), codes
            assert codes.count(frames.TEXT) == len(ids), codes
            assert all(f.payload for f in binary)
            texts = [f.payload for f in binary if f.event_code == frames.TEXT]
            assert texts[0] == b"width: 8, height: 8\n batch size: 3"
            if not metadata:  # ComfyUI's order: a code 1 preview right after its `progress`
                kinds = [f.describe() for f in relayed]
                firsts = [i for i, kind in enumerate(kinds) if kind == "binary:1"]
                assert all(kinds[i - 1] in ("progress", "binary:1") for i in firsts), kinds


def is_subsequence(part: list[Any], whole: list[Any]) -> bool:
    rest = iter(whole)
    return all(any(item == other for other in rest) for item in part)


def of_prompt(received: list[Received], prompt_id: str) -> list[Received]:
    """The frames of one prompt: JSON ones name it; a binary one belongs to the prompt of
    the JSON frame nearest before it."""
    mine, current = [], None
    for frame in received:
        if frame.type != "binary":
            current = frame.data.get("prompt_id") if isinstance(frame.data, dict) else None
        if current == prompt_id:
            mine.append(frame)
    return mine


def preview_steps(received: list[Received], metadata: bool) -> list[int]:
    """The step of each preview, told by the `progress` frame it comes with (code 4 just
    before it, code 1 just after it)."""
    steps = []
    for index, frame in enumerate(received):
        if frame.describe() in ("binary:1", "binary:4"):
            beside = received[index + 1] if metadata else received[index - 1]
            assert beside.type == "progress", [f.describe() for f in received]
            steps.append(int(beside.data["value"]))
    return steps


async def test_a_burst_of_previews_crosses_thinned_to_the_latest_with_nothing_moved(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        sockets = {
            (server.url, metadata): await server.connect("client-t", preview_metadata=metadata)
            for server in (a, b)
            for metadata in (False, True)
        }
        images = int(log_frames.PREVIEW_BURST) + 30  # sent at once: beyond the rate
        prompt_id = await b.submit(preview_prompt(images), "client-t")
        for sock in sockets.values():
            await sock.done(prompt_id)
        # SaveImageWebsocket's images are its output: every one crosses, however fast.
        saved_id = await b.submit(binary_prompt(images=images), "client-t")
        for sock in sockets.values():
            await sock.done(saved_id)
        for metadata in (False, True):
            relayed = client_frames(sockets[a.url, metadata])
            running = client_frames(sockets[b.url, metadata])
            assert [f for f in relayed if f.type != "binary"] == [
                f for f in running if f.type != "binary"
            ]
            assert is_subsequence(relayed, running)  # nothing moved, nothing twice
            mine = of_prompt(relayed, prompt_id)
            assert preview_steps(of_prompt(running, prompt_id), metadata) == list(
                range(1, images + 1)
            )
            kept = preview_steps(mine, metadata)
            assert int(log_frames.PREVIEW_BURST) <= len(kept) < images
            assert kept == sorted(set(kept)) and kept[-1] == images  # the node's last
            assert sum(f.describe() == "binary:3" for f in mine) == 1  # text: never left out
            saved = preview_steps(of_prompt(relayed, saved_id), metadata)
            assert saved == list(range(images))


async def test_a_client_reconnecting_to_another_gateway_is_brought_up_to_date(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        on_b = await b.connect("client-y")
        first = await a.connect("client-y")
        prompt_id = await b.submit(sleep_prompt(3.0), "client-y")
        await first.progress(prompt_id, "2")
        await first.close()
        # A reconnect (or a first connect) mid-run: the current node and progress first.
        again = await a.connect("client-y")
        greeting = next(i for i, f in enumerate(again.frames) if f.type == "status")
        await again.wait_for(lambda f: f.type == "progress_state", what="the catch-up")
        caught_up = [f.type for f in again.frames[greeting + 1 :]][:2]
        assert caught_up == ["executing", "progress_state"], caught_up
        assert again.frames[greeting + 1].data == {
            "node": "2",
            "display_node": "2",
            "prompt_id": prompt_id,
        }
        await again.done(prompt_id)
        await on_b.done(prompt_id)
        # Then every frame from there on, as the running gateway sent them, none twice.
        live = json_frames(again, prompt_id, after=2)
        assert live and live == json_frames(on_b, prompt_id)[-len(live) :]
        assert [kind for kind, _ in live][-2:] == ["execution_success", "executing"]
        assert len(live) < len(json_frames(on_b, prompt_id))


async def test_frames_still_cross_after_the_listening_connection_is_cut(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        on_a = await a.connect("client-z")
        on_b = await b.connect("client-z")
        listener = await listener_of(a.gateway, postgres_database)
        conn = await asyncpg.connect(postgres_database)
        try:
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", listener)
        finally:
            await conn.close()
        # Run while A listens again (or before it does): caught up from the log either way.
        prompt_id = await b.submit(sleep_prompt(0.2), "client-z")
        await on_a.done(prompt_id)
        await on_b.done(prompt_id)
        assert json_frames(on_a, prompt_id) == json_frames(on_b, prompt_id)

        async def listening_again() -> bool:
            pid = await listener_of(a.gateway, postgres_database)
            return pid is not None and pid != listener

        await poll(listening_again, what="A listening again")
        later = await a.submit(sleep_prompt(0.2, 1), "client-z")
        await on_a.done(later)
        await on_b.done(later)
        assert json_frames(on_a, later) == json_frames(on_b, later)
