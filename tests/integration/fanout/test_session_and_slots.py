"""What a job holds, and for how long: the service's HTTP session outlives a batch (the
next prompt's jobs go over the connections the last one opened, until it has been idle
a while), and a pool slot is held until the provider says the job is done, not through
the download of its result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from comfyfleet.fanout import FanoutSettings, PoolSize
from comfyfleet.fanout.session import SessionLease
from comfyfleet.testing.emulators.app import build_emulator_app, emulator_state
from comfyfleet.testing.emulators.state import EmulatorSettings
from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, Graph, MakeRig
from tests.integration.fanout.test_concurrency import run

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def counted() -> AsyncIterator[tuple[Emulator, set[object]]]:
    """An emulator that notes the client end (address, port) of every request."""
    peers: set[object] = set()

    @web.middleware
    async def note_peer(request: web.Request, handler: Handler) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return await handler(request)

    dials = EmulatorSettings(latency=0.2, jitter=0.0, keys=[KEY], seed=1)
    app = build_emulator_app(dials)
    app.middlewares.append(note_peer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield Emulator(server, dials, emulator_state(app)), peers
    await server.close()


def batch(url: str, tag: str, jobs: int = 4) -> dict[str, object]:
    graph = Graph(url)
    graph.collect("c", [graph.submit(f"s{n}", f"{tag} {n}", seed=n) for n in range(jobs)])
    return graph.prompt


async def test_the_next_prompt_reuses_the_connections_of_the_last(
    make_rig: MakeRig, counted: tuple[Emulator, set[object]]
) -> None:
    emulator, peers = counted
    rig = await make_rig()
    assert (await run(rig, batch(emulator.url, "first"))).status == "success"
    first = set(peers)
    assert 1 <= len(first) <= 4 and rig.service.sessions.open
    peers.clear()
    assert (await run(rig, batch(emulator.url, "second"))).status == "success"
    # The second prompt's requests go over the first one's connections (a closed
    # session would have opened new ones for all of them); a request that overlaps
    # more others than any did before may still need one more.
    assert peers & first and len(peers - first) <= 1, (first, peers)
    assert emulator.stats()["jobs"] == 8
    await rig.service.close()
    assert not rig.service.sessions.open


async def test_an_idle_session_closes_after_its_linger() -> None:
    sessions = SessionLease(linger=0.05)
    async with sessions.lease() as session:
        assert not session.closed
    assert sessions.open  # kept for the next job
    async with sessions.lease() as again:
        assert again is session  # a lease within the linger takes the same session
    await _until(lambda: not sessions.open)
    assert session.closed
    async with sessions.lease() as fresh:
        assert fresh is not session and not fresh.closed
    await sessions.close()
    assert fresh.closed


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def slow_downloads() -> AsyncIterator[Emulator]:
    """An emulator whose result files take DOWNLOAD seconds to start coming back."""

    @web.middleware
    async def slow(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/_emulator/files/"):
            await asyncio.sleep(DOWNLOAD)
        return await handler(request)

    dials = EmulatorSettings(latency=JOB, jitter=0.0, keys=[KEY], seed=1)
    app = build_emulator_app(dials)
    app.middlewares.append(slow)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield Emulator(server, dials, emulator_state(app))
    await server.close()


JOB, DOWNLOAD = 0.3, 0.6


async def test_a_slot_starts_its_next_job_while_the_last_result_downloads(
    make_rig: MakeRig, slow_downloads: Emulator
) -> None:
    # One running slot: the provider runs one job at a time for this key. A job the
    # provider has finished no longer counts, so the second is created during the
    # first one's download, not after it.
    rig = await make_rig(FanoutSettings(image=PoolSize(1, 4)))
    result = await run(rig, batch(slow_downloads.url, "slots", jobs=2))
    assert result.status == "success", result.error
    created = sorted(task.ready_at - task.duration for task in slow_downloads.state.tasks.values())
    assert len(created) == 2
    gap = created[1] - created[0]
    assert JOB <= gap < JOB + DOWNLOAD - 0.1, gap
