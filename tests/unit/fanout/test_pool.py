"""The shared pool: runs so many, admits so many more, queues the rest in order, async."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from comfyfleet.fanout.limits import Throttle
from comfyfleet.fanout.pool import Pool
from comfyfleet.fanout.settings import FanoutSettings, PoolSize
from comfyfleet.server.config import load_config
from comfyfleet.server.gateway import fanout_settings


async def test_jobs_run_up_to_concurrency_and_start_in_order() -> None:
    pool = Pool("image", PoolSize(2, 5))
    places = [await pool.join() for _ in range(4)]
    assert [p.running for p in places] == [True, True, False, False]
    assert all(p.admitted for p in places)
    places[1].leave()
    assert places[2].running and not places[3].running
    places[0].leave()
    await asyncio.wait_for(places[3].wait_running(), 1)
    assert (pool.running, pool.waiting) == (2, 0)


async def test_a_full_pool_makes_join_wait_and_says_how_many_are_ahead() -> None:
    pool = Pool("image", PoolSize(1, 1))
    running, pending = await pool.join(), await pool.join()
    heard: list[int] = []
    joining = asyncio.create_task(pool.join(heard.append))
    await asyncio.sleep(0.01)
    assert not joining.done() and heard == [1]
    running.leave()  # pending starts; the waiter moves up and is admitted
    place = await asyncio.wait_for(joining, 1)
    assert place.admitted and not place.running and pending.running
    assert heard == [1]


async def test_cancelling_a_wait_gives_the_place_back() -> None:
    pool = Pool("image", PoolSize(1, 0))
    first = await pool.join()
    waiting = asyncio.create_task(pool.join())
    await asyncio.sleep(0.01)
    assert pool.waiting == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pool.waiting == 0
    first.leave()
    first.leave()  # idempotent
    assert pool.running == 0
    again = await asyncio.wait_for(pool.join(), 1)
    assert again.running


async def test_a_waiter_never_blocks_the_loop() -> None:
    pool = Pool("image", PoolSize(1, 0))
    await pool.join()
    blocked = asyncio.create_task(pool.join())
    ticks = 0
    for _ in range(5):
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 5 and not blocked.done()
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)


def test_sizes_come_from_the_environment() -> None:
    env = {
        "COMFYFLEET_IMAGE_CONCURRENCY": "5",
        "COMFYFLEET_IMAGE_PENDING": "0",
        "COMFYFLEET_VIDEO_CONCURRENCY": " 2 ",
    }
    settings = FanoutSettings.from_env(env)
    assert settings.image == PoolSize(5, 0)
    assert settings.video == PoolSize(2, 10)
    assert FanoutSettings.from_env({}) == FanoutSettings()
    with pytest.raises(ValueError, match="COMFYFLEET_VIDEO_PENDING"):
        FanoutSettings.from_env({"COMFYFLEET_VIDEO_PENDING": "many"})
    with pytest.raises(ValueError):
        PoolSize(0, 1)


async def test_throttle_limits_concurrency_and_paces_requests() -> None:
    throttle = Throttle(concurrency=2, rate=50.0)
    inside = peak = 0

    async def job() -> None:
        nonlocal inside, peak
        async with throttle.slot():
            await throttle.pace()
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.05)
            inside -= 1

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(job() for _ in range(6)))
    assert peak == 2
    assert loop.time() - started >= 5 / 50 - 0.01  # six requests at 50/s span 0.1 s


def test_the_server_config_carries_pool_sizes_and_the_secrets_file(tmp_path: Path) -> None:
    env = {
        "COMFYFLEET_IMAGE_CONCURRENCY": "12",
        "COMFYFLEET_VIDEO_PENDING": "3",
        "COMFYFLEET_SECRETS_FILE": str(tmp_path / "keys.toml"),
    }
    config = load_config(env=env)
    assert config.secrets_file == tmp_path / "keys.toml"
    settings = fanout_settings(config)
    assert settings == FanoutSettings(image=PoolSize(12, 30), video=PoolSize(10, 3))
    assert load_config(env={}).secrets_file is None
