"""A client's frames cross gateways: its WebSocket on gateway A gets every frame of its
prompts that gateway B runs (two in-process gateways on one PostgreSQL), the same and in
the same order as a socket of the same client on B, with reconnect catch-up, and after
A's listening connection was cut."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from comfyfleet.server.gateway import Gateway
from comfyfleet.store.postgres import LISTENER_NAME
from tests.integration.gateway.wire import Served, Socket, poll, serve, sleep_prompt

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
        ids = [
            await server.submit(sleep_prompt(0.4, n), "client-x")
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
