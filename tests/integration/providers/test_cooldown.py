"""A burst of 429s pauses every request to the provider, not just the unlucky one."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from comfyfleet.nodes.providers.bfl.client import BFLClient
from comfyfleet.provider_http.retry import Backoff, Cooldown
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

PAUSE = 0.5


async def test_cooldown_is_shared_by_concurrent_requests(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.rate_limit = 1.0
    emulator.settings.send_retry_after = False  # only the burst rule can slow the clients
    cooldown = Cooldown(burst=2, window=10.0, pause=PAUSE)
    # Two clients of one provider share the cooldown, as the fan-out nodes will.
    clients = [
        BFLClient(
            session,
            emulator.url,
            KEY,
            max_attempts=30,
            cooldown=cooldown,
            backoff=Backoff(base=0.005, cap=0.01),
        )
        for _ in range(2)
    ]
    tasks = await asyncio.gather(
        *(clients[i % 2].submit("flux-dev", {"prompt": f"p{i}", "seed": i}) for i in range(4))
    )
    assert len({task.id for task in tasks}) == 4

    log = emulator.state.create_log
    refused = [at for at, _, status in log if status == 429]
    burst_at = refused[1]
    # Requests already in flight at the burst may still land; then nothing until it ends.
    quiet = [at for at, _, _ in log if burst_at + 0.05 < at < burst_at + PAUSE * 0.9]
    assert quiet == []
    # Retrying every 5-10 ms without the cooldown would have hit the emulator hundreds
    # of times during the three seconds it takes to admit four jobs at 1/s.
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 4 and stats["create_requests"] < 25


async def test_a_cooldown_holds_job_creation_not_the_polls_of_running_jobs(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 0.2
    emulator.settings.rate_limit = 1.0
    emulator.settings.send_retry_after = False
    cooldown = Cooldown(burst=2, window=10.0, pause=3.0)

    def client() -> BFLClient:
        backoff = Backoff(base=0.005, cap=0.01)
        return BFLClient(
            session,
            emulator.url,
            KEY,
            max_attempts=30,
            cooldown=cooldown,
            backoff=backoff,
            poll_interval=0.02,
        )

    running = client()
    task = await running.submit("flux-dev", {"prompt": "first", "seed": 0})
    # Two more jobs inside the same second: 429, 429, and the pause starts.
    later = [
        asyncio.create_task(client().submit("flux-dev", {"prompt": f"p{n}", "seed": n}))
        for n in (1, 2)
    ]
    async with asyncio.timeout(2.0):
        while cooldown.remaining() == 0:
            await asyncio.sleep(0.005)
    started = time.monotonic()
    answer = await running.poll(task)
    sample = answer["result"]["sample"]
    assert await running.download(sample, task_id=task.id)
    # The accepted job's polls and download went on; creation is still paused.
    assert time.monotonic() - started < 1.0
    assert cooldown.remaining() > 0
    await asyncio.gather(*later)
    assert emulator.stats()["jobs"] == 3


async def test_429s_on_polls_delay_that_job_only(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 0.1
    emulator.settings.retry_after = 0.1
    emulator.settings.throttle_next_polls = 3
    cooldown = Cooldown(burst=2, window=10.0, pause=30.0)
    bfl = BFLClient(session, emulator.url, KEY, poll_interval=0.02, cooldown=cooldown)
    started = time.monotonic()
    assert await bfl.run("flux-dev", {"prompt": "polled", "seed": 1})
    # Three 429s, each waited out as the provider asked (0.1 s), not the 30 s pause;
    # and job creation never paused.
    assert time.monotonic() - started < 5.0
    assert emulator.stats()["reads_rate_limited"] == 3
    assert cooldown.remaining() == 0


async def test_the_providers_retry_after_is_the_pause_and_its_pace_is_kept(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    """Thirty jobs against twenty a second: the ten refused go again when the provider
    says (Retry-After: 1), not after the 5 s pause kept for 429s that say nothing; the
    next thirty are spaced to the pace the 429s showed, and none is refused."""
    emulator.settings.rate_limit = 20.0
    emulator.settings.retry_after = None  # the emulator says when a slot frees (1 s)
    cooldown = Cooldown(burst=3, window=10.0, pause=5.0)
    bfl = BFLClient(
        session, emulator.url, KEY, max_attempts=10, cooldown=cooldown, backoff=Backoff(0.01)
    )

    async def batch(tag: str) -> float:
        started = time.monotonic()
        submits = (bfl.submit("flux-dev", {"prompt": f"{tag}{i}", "seed": i}) for i in range(30))
        tasks = await asyncio.gather(*submits)
        assert len({task.id for task in tasks}) == 30
        return time.monotonic() - started

    first = await batch("a")
    refused = emulator.stats()["rate_limited"]
    assert refused == 10 and cooldown.limit == 20
    assert 0.9 < first < 2.5  # one second's wait, as asked
    await asyncio.sleep(1.0)  # the window empties
    second = await batch("b")
    assert emulator.stats()["rate_limited"] == refused  # the pace held: no 429
    assert 0.9 < second < 2.5  # twenty at once, ten a second later
    assert emulator.stats()["jobs"] == 60
