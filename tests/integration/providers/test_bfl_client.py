"""The BFL client against the emulator: the whole submit -> poll -> download path."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import aiohttp
import pytest
from PIL import Image

from comfyfleet.nodes.providers.bfl.client import BFLClient, SubmittedTask
from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
    RateLimited,
)
from comfyfleet.provider_http.retry import Backoff, Cooldown
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

BODY: dict[str, Any] = {"prompt": "a red fox", "width": 96, "height": 64, "seed": 5}


def client(emulator: Emulator, session: aiohttp.ClientSession, **options: Any) -> BFLClient:
    settings: dict[str, Any] = {
        "poll_interval": 0.02,
        "timeout": 5.0,
        "backoff": Backoff(base=0.01, cap=0.05),
        "cooldown": Cooldown(burst=100),
    }
    return BFLClient(session, emulator.url, KEY, **{**settings, **options})


def png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG"
        return image.size


async def test_run_submits_polls_and_downloads(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 0.2
    submitted: list[SubmittedTask] = []
    progress: list[tuple[str, float | None]] = []

    async def on_progress(task: SubmittedTask, status: str, value: float | None) -> None:
        progress.append((status, value))

    data = await client(emulator, session).run(
        "flux-pro-1.1", BODY, on_submitted=submitted.append, on_progress=on_progress
    )
    assert png_size(data) == (96, 64)
    [task] = submitted
    assert task.model == "flux-pro-1.1"
    assert task.polling_url.startswith(emulator.url + "/v1/get_result?id=")
    assert progress and all(status == "Pending" for status, _ in progress)
    values = [v for _, v in progress if v is not None]
    assert values == sorted(values) and all(0 <= v <= 1 for v in values)
    stats = await emulator.fetch_stats(session)
    assert stats["jobs"] == 1 and stats["jobs_by_model"] == {"flux-pro-1.1": 1}
    assert stats["downloads"] == 1 and stats["duplicates"] == 0


async def test_base_url_with_v1_suffix_is_accepted(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    bfl = BFLClient(session, emulator.url + "/v1/", KEY, poll_interval=0.02)
    assert png_size(await bfl.run("flux-dev", BODY)) == (96, 64)


async def test_429_waits_for_retry_after(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.rate_limit = 1.0  # one job per second per key
    bfl = client(emulator, session)
    await bfl.submit("flux-dev", BODY)
    started = time.monotonic()
    await bfl.submit("flux-dev", {**BODY, "seed": 6})
    waited = time.monotonic() - started
    # The emulator answered "Retry-After: 1"; the backoff alone would be < 0.05 s.
    assert waited >= 0.95
    stats = await emulator.fetch_stats(session)
    assert stats["rate_limited"] == 1 and stats["jobs"] == 2


async def test_429_gives_up_after_max_attempts(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.rate_limit = 0.01
    emulator.settings.send_retry_after = False
    bfl = client(emulator, session, max_attempts=3)
    await bfl.submit("flux-dev", BODY)
    with pytest.raises(RateLimited) as caught:
        await bfl.submit("flux-dev", BODY)
    assert caught.value.status == 429 and caught.value.retry_after is None
    assert (await emulator.fetch_stats(session))["rate_limited"] == 3


async def test_5xx_on_submit_is_retried_without_duplicates(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.fail_next = 2
    data = await client(emulator, session).run("flux-dev", BODY)
    assert png_size(data) == (96, 64)
    stats = await emulator.fetch_stats(session)
    assert stats["create_requests"] == 3 and stats["failed"] == 2
    assert stats["jobs"] == 1 and stats["duplicates"] == 0


async def test_connection_refused_is_retried_then_reported_as_not_sent(
    session: aiohttp.ClientSession, unused_tcp_port: int
) -> None:
    bfl = BFLClient(
        session,
        f"http://127.0.0.1:{unused_tcp_port}",
        KEY,
        max_attempts=3,
        backoff=Backoff(base=0.01, cap=0.01),
    )
    with pytest.raises(ProviderError) as caught:
        await bfl.submit("flux-dev", BODY)
    # Not AmbiguousSubmit: the provider cannot have seen a request that never connected.
    assert type(caught.value) is ProviderError and caught.value.retryable


async def test_failed_polls_are_retried(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.fail_next_polls = 3
    data = await client(emulator, session).run("flux-dev", BODY)
    assert png_size(data) == (96, 64)
    stats = await emulator.fetch_stats(session)
    assert stats["polls"] >= 4 and stats["jobs"] == 1


async def test_hang_after_submit_is_ambiguous_and_not_resent(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.hang_next = 1
    bfl = client(emulator, session, timeout=0.3, max_attempts=5)
    with pytest.raises(AmbiguousSubmit) as caught:
        await bfl.submit("flux-dev", BODY)
    assert not caught.value.retryable
    stats = await emulator.fetch_stats(session)
    assert stats["create_requests"] == 1 and stats["jobs"] == 1 and stats["hung"] == 1


async def test_moderated_job(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.moderation_rate = 1.0
    submitted: list[SubmittedTask] = []
    with pytest.raises(ModerationError) as caught:
        await client(emulator, session).run("flux-dev", BODY, on_submitted=submitted.append)
    assert caught.value.task_id == submitted[0].id
    stats = await emulator.fetch_stats(session)
    assert stats["moderated"] == 1 and stats["cancels"] == 0  # a finished job is not cancelled


async def test_failed_job_and_lost_task(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.settings.error_rate = 1.0
    bfl = client(emulator, session)
    with pytest.raises(JobFailed, match="'Error'"):
        await bfl.run("flux-dev", BODY)
    lost = SubmittedTask("no-such-task", f"{emulator.url}/v1/get_result?id=no-such-task")
    with pytest.raises(JobFailed, match="Task not found"):
        await bfl.poll(lost)


async def test_cancelling_run_cancels_the_job(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 30.0
    submitted = asyncio.Event()
    running = asyncio.create_task(
        client(emulator, session).run("flux-dev", BODY, on_submitted=lambda _: submitted.set())
    )
    await submitted.wait()
    await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    stats = await emulator.fetch_stats(session)
    assert stats["cancels"] == 1 and stats["cancelled"] == 1


async def test_explicit_cancel_and_unsupported_cancel(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 30.0
    bfl = client(emulator, session)
    task = await bfl.submit("flux-dev", BODY)
    assert await bfl.cancel(task) is True
    with pytest.raises(ProviderCancelled):
        await bfl.poll(task)
    # A provider without the endpoint (404/405) means "not supported", not an error.
    assert await client(emulator, session, cancel_path="/v1/no-cancel-here").cancel(task) is False
    assert await client(emulator, session, cancel_path=None).cancel(task) is False


async def test_deadline_gives_up_and_cancels(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.settings.latency = 30.0
    with pytest.raises(ProviderError, match="no result after") as caught:
        await client(emulator, session, deadline=0.2).run("flux-dev", BODY)
    assert caught.value.task_id is not None and not caught.value.retryable
    assert (await emulator.fetch_stats(session))["cancelled"] == 1


async def test_wrong_key_is_refused_without_retries(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    bfl = BFLClient(session, emulator.url, "not-" + KEY, backoff=Backoff(base=0.01))
    with pytest.raises(ProviderError) as caught:
        await bfl.submit("flux-dev", BODY)
    assert caught.value.status == 403 and not caught.value.retryable
    stats = await emulator.fetch_stats(session)
    assert stats["unauthorized"] == 1 and stats["jobs"] == 0


async def test_foreign_polling_url_does_not_receive_the_key(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    bfl = client(emulator, session)
    real = await bfl.submit("flux-dev", BODY)
    forged = SubmittedTask(real.id, "http://203.0.113.9:9/v1/get_result?id=" + real.id)
    # Polled on the base URL instead; an attempt at 203.0.113.9 would time out.
    result = await bfl.poll(forged)
    assert result["status"] == "Ready"
