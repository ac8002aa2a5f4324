"""The OpenAI-compatible videos client against the emulator."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from comfyfleet.fanout.mp4 import read_info
from comfyfleet.nodes.providers.openai_videos.client import OpenAIVideosClient
from comfyfleet.provider_http.errors import JobFailed, ModerationError, ProviderError
from comfyfleet.provider_http.retry import Backoff, Cooldown
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

FIELDS = {"model": "sora-2", "prompt": "a paper boat", "seconds": "4", "size": "720x1280"}


def client(
    emulator: Emulator, session: aiohttp.ClientSession, key: str = KEY, **options: Any
) -> OpenAIVideosClient:
    settings: dict[str, Any] = {
        "poll_interval": 0.02,
        "timeout": 5.0,
        "backoff": Backoff(base=0.01, cap=0.05),
        "cooldown": Cooldown(burst=100),
    }
    return OpenAIVideosClient(session, emulator.url, key, **{**settings, **options})


async def test_create_wait_download(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    videos = client(emulator, session)
    video_id = await videos.create(FIELDS)
    answer = await videos.wait(video_id)
    assert answer["status"] == "completed" and answer["id"] == video_id
    info = read_info(await videos.download(video_id))
    assert (info.width, info.height, info.seconds) == (720, 1280, 4.0)
    stats = await emulator.fetch_stats(session)
    assert (stats["jobs"], stats["downloads"], stats["duplicates"]) == (1, 1, 0)


async def test_a_reference_image_is_sent_as_a_file(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    videos = client(emulator, session)
    await videos.create(FIELDS, b"\x89PNG\r\n\x1a\n" + bytes(32))
    await videos.create(FIELDS)
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 2 and stats["duplicates"] == 0  # the file made the bodies differ


async def test_a_failed_job_and_a_moderated_one_raise_what_they_are(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    videos = client(emulator, session)
    emulator.settings.error_rate = 1.0
    with pytest.raises(JobFailed, match="video_generation_failed"):
        await videos.wait(await videos.create(FIELDS))
    emulator.settings.error_rate, emulator.settings.moderation_rate = 0.0, 1.0
    with pytest.raises(ModerationError):
        await videos.wait(await videos.create(FIELDS))


async def test_a_refused_create_is_retried_and_429s_on_polls_wait_on_their_own(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.fail_next = 1
    emulator.settings.throttle_next_polls = 2
    emulator.settings.retry_after = 0.01
    videos = client(emulator, session)
    await videos.wait(await videos.create(FIELDS))
    stats = await emulator.fetch_stats(session)
    assert (stats["create_requests"], stats["jobs"]) == (2, 1)
    assert stats["reads_rate_limited"] == 2
    assert videos.cooldown.rate_limited_count == 0  # poll 429s never pause job creation


async def test_delete_drops_a_running_job(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 5.0
    videos = client(emulator, session)
    video_id = await videos.create(FIELDS)
    assert await videos.delete(video_id)
    with pytest.raises(JobFailed, match="not found"):
        await videos.wait(video_id)
    assert (await emulator.fetch_stats(session))["cancelled"] == 1
    assert not await videos.delete("video_unknown")


async def test_invalid_fields_fail_without_a_retry(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    with pytest.raises(ProviderError) as raised:
        await client(emulator, session).create({**FIELDS, "seconds": "5"})
    assert raised.value.status == 400 and not raised.value.retryable
    assert (await emulator.fetch_stats(session))["jobs"] == 0


async def test_the_key_appears_in_no_error_or_log_line(
    emulator: Emulator, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    emulator.settings.keys = ["another-key"]
    videos = client(emulator, session)
    with pytest.raises(ProviderError) as raised:
        await videos.create(FIELDS)
    assert not await videos.delete("video_x")
    refused = OpenAIVideosClient(session, "http://127.0.0.1:9", KEY, timeout=0.5, max_attempts=1)
    with pytest.raises(ProviderError) as unreachable:
        await refused.create(FIELDS)
    for text in (str(raised.value), repr(raised.value), str(unreachable.value), caplog.text):
        assert KEY not in text and KEY[:12] not in text
