"""The OpenAI-compatible images client against the emulator."""

from __future__ import annotations

import io
import time
from typing import Any

import aiohttp
import pytest
from PIL import Image

from comfyfleet.nodes.providers.openai_images.client import FieldValue, OpenAIImagesClient
from comfyfleet.provider_http.errors import AmbiguousSubmit, ModerationError, ProviderError
from comfyfleet.provider_http.retry import Backoff, Cooldown
from comfyfleet.testing.emulators.png import render_png
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

BODY: dict[str, Any] = {"model": "gpt-image-1", "prompt": "a blue whale", "size": "64x48"}


def client(
    emulator: Emulator, session: aiohttp.ClientSession, **options: Any
) -> OpenAIImagesClient:
    settings: dict[str, Any] = {
        "timeout": 5.0,
        "backoff": Backoff(base=0.01, cap=0.05),
        "cooldown": Cooldown(burst=100),
    }
    return OpenAIImagesClient(session, emulator.url, KEY, **{**settings, **options})


def sizes(images: list[bytes]) -> list[tuple[int, int]]:
    result = []
    for data in images:
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "PNG"
            result.append(image.size)
    return result


async def test_generate_b64_json(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    images = await client(emulator, session).generate({**BODY, "n": 2})
    assert sizes(images) == [(64, 48), (64, 48)]
    assert images[0] != images[1]  # each image of a request differs
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 1 and stats["jobs_by_model"] == {"gpt-image-1": 1}


async def test_generate_url_is_downloaded(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    images = await client(emulator, session).generate({**BODY, "response_format": "url"})
    assert sizes(images) == [(64, 48)]
    assert (await emulator.fetch_stats(session))["downloads"] == 1


async def test_edit_sends_multipart_images_and_mask(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    source = render_png(32, 32, (1, 2, 3))
    fields: dict[str, FieldValue] = {
        "model": "gpt-image-1",
        "prompt": "add a hat",
        "size": "80x64",
        "n": 1,
    }
    openai = client(emulator, session)
    images = await openai.edit(fields, [("a.png", source), ("b.png", source)], mask=source)
    assert sizes(images) == [(80, 64)]
    # Different input images are a different job, with a different result.
    other = await openai.edit(fields, [("a.png", render_png(32, 32, (9, 9, 9)))])
    assert other != images
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 2 and stats["duplicates"] == 0


async def test_moderation(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.moderation_rate = 1.0
    with pytest.raises(ModerationError, match="moderation_blocked") as caught:
        await client(emulator, session).generate(BODY)
    assert caught.value.status == 400 and not caught.value.retryable


async def test_429_waits_for_retry_after(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.rate_limit = 1.0
    openai = client(emulator, session)
    await openai.generate(BODY)
    started = time.monotonic()
    await openai.generate(BODY)
    assert time.monotonic() - started >= 0.95
    assert (await emulator.fetch_stats(session))["rate_limited"] == 1


async def test_429_without_retry_after_uses_ratelimit_reset(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.rate_limit = 2.0  # two per second
    emulator.settings.send_retry_after = False
    openai = client(emulator, session)
    started = time.monotonic()
    for _ in range(3):
        await openai.generate(BODY)
    # The third request waited for the x-ratelimit-reset-requests the 429 carried.
    assert time.monotonic() - started >= 0.9
    assert (await emulator.fetch_stats(session))["rate_limited"] == 1


async def test_5xx_is_retried(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.fail_next = 1
    assert sizes(await client(emulator, session).generate(BODY)) == [(64, 48)]
    stats = await emulator.fetch_stats(session)
    assert stats["create_requests"] == 2 and stats["jobs"] == 1


async def test_timeout_after_sending_is_ambiguous_and_not_resent(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.hang_next = 1
    with pytest.raises(AmbiguousSubmit):
        await client(emulator, session, timeout=0.3).generate(BODY)
    stats = await emulator.fetch_stats(session)
    assert stats["create_requests"] == 1 and stats["jobs"] == 1


async def test_timeout_with_idempotency_key_is_retried_with_the_same_key(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.hang_next = 1
    openai = client(emulator, session, timeout=0.5)
    images = await openai.generate(BODY, idempotency_key="job-42")
    assert sizes(images) == [(64, 48)]
    stats = await emulator.fetch_stats(session)
    assert stats["create_requests"] == 2 and stats["idempotency_keys"] == {"job-42": 2}


async def test_wrong_key(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    openai = OpenAIImagesClient(session, emulator.url, "sk-wrong-" + KEY)
    with pytest.raises(ProviderError) as caught:
        await openai.generate(BODY)
    assert caught.value.status == 403 and not caught.value.retryable
    assert "invalid_api_key" in str(caught.value)
