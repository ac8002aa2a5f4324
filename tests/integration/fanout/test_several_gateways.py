"""Two `comfyfleet serve` processes on one PostgreSQL store share the fan-out journal:
no paid job is sent twice across them. A gateway that wants a request the other has
in flight waits on that job through the store; when the owner is killed, the other
takes its jobs over and polls them by their stored ids; when the owner's prompt is
interrupted, a job the other still waits on is handed over, not cancelled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, KEY_ENV, start_emulator
from tests.integration.fanout.test_server_process import batch, history, post, until
from tests.servers import ServerProcess

LEASE = 2.0
JOBS = 4
WAITED_ON = """
SELECT count(*) FROM remote_job_waiters w JOIN remote_jobs r ON r.id = w.job_id
WHERE r.state = 'running' AND r.remote_id IS NOT NULL
"""


@pytest.fixture
async def slow_emulator() -> AsyncIterator[Emulator]:
    started = await start_emulator(latency=3.0)
    yield started
    await started.server.close()


@asynccontextmanager
async def two_gateways(tmp_path: Path, url: str) -> AsyncIterator[list[ServerProcess]]:
    async with AsyncExitStack() as stack:
        servers = []
        for n in range(2):
            server = ServerProcess(
                tmp_path / f"gateway-{n}",
                *("--store", url, "--local-slots", "2", "--lease", f"{LEASE}s"),
                *("--gateway-id", f"gw-{n}"),
            )
            await asyncio.to_thread(server.start)
            stack.callback(server.kill)
            servers.append(server)
        yield servers


async def waiting_on(url: str, count: int) -> None:
    """Until `count` sent jobs (their provider ids journaled) are waited on by a gateway
    other than their owner."""
    conn = await asyncpg.connect(url)
    try:
        for _ in range(200):
            if await conn.fetchval(WAITED_ON) == count:
                return
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise AssertionError(f"{count} jobs were not waited on in time")


def succeeded(entry: dict[str, Any]) -> int:
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = json.loads(entry["outputs"]["c"]["text"][0])
    return int(report["counts"]["success"])


async def test_one_prompt_on_two_gateways_at_once_sends_each_job_once(
    tmp_path: Path,
    postgres_database: str,
    slow_emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    graph = batch(slow_emulator.url, JOBS)
    async with (
        aiohttp.ClientSession() as session,
        two_gateways(tmp_path, postgres_database) as servers,
    ):
        sent = await asyncio.gather(
            *(post(session, server, {"prompt": graph.prompt}) for server in servers)
        )
        for server, answer in zip(servers, sent):
            entry = await history(session, server, answer["prompt_id"], timeout=30)
            assert succeeded(entry) == JOBS
    stats = slow_emulator.stats()
    assert (stats["jobs"], stats["duplicates"], stats["cancels"]) == (JOBS, 0, 0)


async def owner_then_waiter(
    session: aiohttp.ClientSession,
    servers: tuple[ServerProcess, ServerProcess],
    prompt: dict[str, Any],
    emulator: Emulator,
    database: str,
) -> tuple[str, str]:
    """The same prompt on the owner (which sends every job), then on the other gateway,
    until the other waits on the owner's jobs; the two prompt ids."""
    owner, other = servers
    first = (await post(session, owner, {"prompt": prompt}))["prompt_id"]
    await until(lambda: emulator.stats()["jobs"] == JOBS, "every job sent")
    second = (await post(session, other, {"prompt": prompt}))["prompt_id"]
    await waiting_on(database, JOBS)  # the other waits on the owner's jobs
    return first, second


async def test_the_owner_killed_mid_job_its_jobs_are_polled_by_the_other_not_resent(
    tmp_path: Path,
    postgres_database: str,
    slow_emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    slow_emulator.settings.latency = 6.0
    graph = batch(slow_emulator.url, JOBS)
    async with (
        aiohttp.ClientSession() as session,
        two_gateways(tmp_path, postgres_database) as (owner, other),
    ):
        first, second = await owner_then_waiter(
            session, (owner, other), graph.prompt, slow_emulator, postgres_database
        )
        await asyncio.to_thread(owner.kill)
        # The other's own prompt, and the killed gateway's (re-queued there once its
        # lease has run out), both finish on the other, from the jobs already paid for.
        for prompt_id in (second, first):
            entry = await history(session, other, prompt_id, timeout=40)
            assert succeeded(entry) == JOBS
        log = other.log.read_text()
        assert "took over remote job" in log
    stats = slow_emulator.stats()
    assert (stats["jobs"], stats["duplicates"], stats["cancels"]) == (JOBS, 0, 0)


async def test_an_interrupted_owner_hands_jobs_the_other_waits_on_over(
    tmp_path: Path,
    postgres_database: str,
    slow_emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    slow_emulator.settings.latency = 4.0
    graph = batch(slow_emulator.url, JOBS)
    async with (
        aiohttp.ClientSession() as session,
        two_gateways(tmp_path, postgres_database) as (owner, other),
    ):
        first, second = await owner_then_waiter(
            session, (owner, other), graph.prompt, slow_emulator, postgres_database
        )
        async with session.post(f"{owner.url}/interrupt", json={"prompt_id": first}) as answer:
            assert answer.status == 200
        entry = await history(session, owner, first, timeout=20)
        assert entry["status"]["status_str"] == "error", entry["status"]  # interrupted
        assert slow_emulator.stats()["cancels"] == 0  # the other still waits on them
        entry = await history(session, other, second, timeout=30)
        assert succeeded(entry) == JOBS
    stats = slow_emulator.stats()
    assert (stats["jobs"], stats["duplicates"], stats["cancels"]) == (JOBS, 0, 0)
