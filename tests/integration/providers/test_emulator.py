"""The emulator itself, spoken to over raw HTTP."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from PIL import Image

from comfyfleet.testing.emulators.app import build_emulator_app
from comfyfleet.testing.emulators.state import EmulatorSettings, key_label
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

HEADERS = {"x-key": KEY}


async def create(
    session: aiohttp.ClientSession, emulator: Emulator, body: dict[str, Any], key: str = KEY
) -> dict[str, Any]:
    async with session.post(
        f"{emulator.url}/v1/flux-dev", json=body, headers={"x-key": key}
    ) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def result_png(session: aiohttp.ClientSession, polling_url: str) -> bytes:
    while True:
        async with session.get(polling_url, headers=HEADERS) as response:
            answer = await response.json()
        if answer["status"] == "Ready":
            async with session.get(answer["result"]["sample"]) as download:
                assert download.content_type == "image/png"
                return await download.read()
        assert answer["status"] == "Pending"
        await asyncio.sleep(0.02)


def size_and_pixel(data: bytes) -> tuple[tuple[int, int], Any]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size, image.getpixel((0, 0))


async def test_same_prompt_and_seed_give_the_same_png(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    body = {"prompt": "lighthouse", "seed": 9, "width": 64, "height": 32}
    first = await create(session, emulator, body)
    second = await create(session, emulator, body)
    other = await create(session, emulator, {**body, "seed": 10})
    assert first["id"] != second["id"]
    a, b, c = [await result_png(session, job["polling_url"]) for job in (first, second, other)]
    assert a == b
    assert size_and_pixel(a)[0] == (64, 32)
    assert size_and_pixel(a)[1] != size_and_pixel(c)[1]
    stats = await emulator.fetch_stats(session)
    # Identical bodies are what "duplicates" counts: the proof tests look for.
    assert stats["jobs"] == 3 and stats["duplicates"] == 1


async def test_aspect_ratio_sets_the_size(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    job = await create(session, emulator, {"prompt": "p", "seed": 1, "aspect_ratio": "1:2"})
    (width, height), _ = size_and_pixel(await result_png(session, job["polling_url"]))
    assert abs(height / width - 2) < 0.05 and width % 32 == 0 and height % 32 == 0


async def test_keys_are_checked_and_never_echoed(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    url = f"{emulator.url}/v1/flux-dev"
    async with session.post(url, json={"prompt": "p"}) as response:
        assert response.status == 401
    async with session.post(url, json={"prompt": "p"}, headers={"x-key": "wrong"}) as response:
        assert response.status == 403
    generations = f"{emulator.url}/v1/images/generations"
    bearer = {"Authorization": "Bearer wrong-key-value"}
    async with session.post(generations, json={"prompt": "p"}, headers=bearer) as response:
        assert response.status == 403
        assert (await response.json())["error"]["code"] == "invalid_api_key"
        assert "wrong-key-value" not in await response.text()
    await create(session, emulator, {"prompt": "p"})
    stats = await emulator.fetch_stats(session)
    assert stats["jobs_by_key"] == {key_label(KEY): 1}
    assert KEY not in str(stats) and KEY[:8] not in str(stats)


async def test_any_key_is_accepted_when_none_is_configured(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.keys = []
    await create(session, emulator, {"prompt": "p"}, key="alice-key")
    await create(session, emulator, {"prompt": "p"}, key="bob-key")
    stats = await emulator.fetch_stats(session)
    assert sorted(stats["jobs_by_key"]) == sorted([key_label("alice-key"), key_label("bob-key")])


async def test_max_active_answers_429_with_retry_after(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 10.0
    emulator.settings.max_active = 1
    await create(session, emulator, {"prompt": "p"})
    async with session.post(
        f"{emulator.url}/v1/flux-dev", json={"prompt": "q"}, headers=HEADERS
    ) as response:
        assert response.status == 429
        assert 9 <= int(response.headers["Retry-After"]) <= 10


async def test_a_share_of_every_kind_of_request_is_answered_429(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 0.0
    task = await create(session, emulator, {"prompt": "x", "width": 32, "height": 32})
    await asyncio.sleep(0.05)
    async with session.get(task["polling_url"], headers=HEADERS) as response:
        sample = (await response.json())["result"]["sample"]
    emulator.settings.throttle_rate = 1.0
    url = f"{emulator.url}/v1/flux-dev"
    for method, target, headers in [
        ("POST", url, HEADERS),
        ("GET", task["polling_url"], HEADERS),
        ("GET", sample, {}),
    ]:
        body = {"prompt": "y"} if method == "POST" else None
        async with session.request(method, target, headers=headers, json=body) as response:
            assert response.status == 429 and response.headers["Retry-After"] == "1"
    stats = emulator.stats()
    assert (stats["rate_limited"], stats["reads_rate_limited"], stats["jobs"]) == (1, 2, 1)


async def test_result_urls_expire(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.sample_ttl = 0.0
    job = await create(session, emulator, {"prompt": "p"})
    await asyncio.sleep(0.1)
    async with session.get(job["polling_url"], headers=HEADERS) as response:
        sample = (await response.json())["result"]["sample"]
    await asyncio.sleep(0.01)
    async with session.get(sample) as response:
        assert response.status == 403


async def test_cancel_and_reset(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.latency = 10.0
    job = await create(session, emulator, {"prompt": "p"})
    cancel = f"{emulator.url}/v1/cancel?id={job['id']}"
    async with session.delete(cancel, headers=HEADERS) as response:
        assert (await response.json())["cancelled"] is True
    async with session.get(job["polling_url"], headers=HEADERS) as response:
        assert (await response.json())["status"] == "Cancelled"
    stats = await emulator.fetch_stats(session)
    assert stats["cancels"] == 1 and stats["cancelled"] == 1
    async with session.post(f"{emulator.url}/_emulator/reset") as response:
        assert response.status == 200
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 0 and stats["cancels"] == 0
    async with session.get(job["polling_url"], headers=HEADERS) as response:
        assert (await response.json())["status"] == "Task not found"


async def test_openai_generation_sleeps_the_latency(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 0.3
    started = time.monotonic()
    async with session.post(
        f"{emulator.url}/v1/images/generations",
        json={"prompt": "p", "size": "40x20", "response_format": "url"},
        headers={"Authorization": f"Bearer {KEY}"},
    ) as response:
        answer = await response.json()
    assert time.monotonic() - started >= 0.3
    assert isinstance(answer["created"], int)
    async with session.get(answer["data"][0]["url"]) as download:
        assert size_and_pixel(await download.read())[0] == (40, 20)


async def test_shutdown_releases_hung_requests(session: aiohttp.ClientSession) -> None:
    server = TestServer(build_emulator_app(EmulatorSettings(hang_rate=1.0)), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/v1/flux-dev"))
    hung = asyncio.create_task(session.post(url, json={"prompt": "p"}))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await server.close()
    assert time.monotonic() - started < 5
    response = await hung
    response.release()
