"""A burst of 429s pauses every request to the provider, not just the unlucky one."""

from __future__ import annotations

import asyncio

import aiohttp

from comfyfleet.providers.bfl import BFLClient
from comfyfleet.providers.retry import Backoff, Cooldown
from tests.integration.providers.conftest import KEY, Emulator

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
