"""Retry decisions and reply classification, without a network."""

from __future__ import annotations

import json
import random

import pytest
from multidict import CIMultiDict

from comfyfleet.nodes.providers.bfl.client import _progress, _same_site
from comfyfleet.nodes.providers.openai_images.client import OpenAIImagesClient
from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    ModerationError,
    ProviderError,
    RateLimited,
)
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown
from comfyfleet.provider_http.transport import Attempts, Http, Reply, api_root
from tests.helpers import FakeTime


def attempts(recorder: FakeTime, max_attempts: int = 4) -> Attempts:
    return Attempts(
        max_attempts=max_attempts,
        backoff=Backoff(base=1.0, cap=1.0, rng=random.Random(0)),
        cooldown=Cooldown(burst=100, clock=recorder.clock, sleep=recorder.sleep),
        sleep=recorder.sleep,
    )


async def test_retryable_errors_are_retried_until_success() -> None:
    recorder = FakeTime()
    flaky = ProviderError("p", "flaky", retryable=True)
    outcomes: list[Exception | str] = [flaky, flaky, "ok"]

    async def operation() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert await attempts(recorder).run(operation, "op") == "ok"
    assert len(recorder.slept) == 2 and all(0 <= s <= 1 for s in recorder.slept)


async def test_non_retryable_errors_and_exhaustion_are_raised() -> None:
    calls = 0

    async def ambiguous() -> None:
        nonlocal calls
        calls += 1
        raise AmbiguousSubmit("p", "maybe sent")

    with pytest.raises(AmbiguousSubmit):
        await attempts(FakeTime()).run(ambiguous, "op")
    assert calls == 1

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise ProviderError("p", "down", retryable=True)

    calls = 0
    with pytest.raises(ProviderError):
        await attempts(FakeTime(), max_attempts=3).run(flaky, "op")
    assert calls == 3


async def test_retry_after_is_waited_through_the_shared_cooldown() -> None:
    recorder = FakeTime()
    runner = attempts(recorder)
    results: list[Exception | str] = [RateLimited("p", "429", retry_after=7.0), "ok"]

    async def operation() -> str:
        outcome = results.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert await runner.run(operation, "op") == "ok"
    # The retry itself did not add backoff; the cooldown slept the 7 s.
    assert recorder.slept[0] == 0.0
    assert sum(recorder.slept) == pytest.approx(7.0)


async def test_without_a_cooldown_a_429_delays_only_its_own_retry() -> None:
    recorder = FakeTime()
    retries: list[int] = []
    runner = Attempts(
        max_attempts=4,
        backoff=Backoff(base=1.0, cap=1.0, rng=random.Random(0)),
        on_retry=lambda: retries.append(1),
        sleep=recorder.sleep,
    )
    outcomes: list[Exception | str] = [
        RateLimited("p", "429", retry_after=2.5),
        RateLimited("p", "429"),
        "ok",
    ]

    async def operation() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert await runner.run(operation, "poll") == "ok"
    # The provider's hint, then the jittered backoff; each retry heard once.
    assert recorder.slept[0] == 2.5 and 0 <= recorder.slept[1] <= 1.0
    assert len(retries) == 2


def reply(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, CIMultiDict(headers or {}), body)


def test_status_classification_for_job_creating_requests() -> None:
    http = Http("p", None, Redactor(), timeout=1, connect_timeout=1)  # type: ignore[arg-type]
    limited = http.error_for(
        reply(429, headers={"Retry-After": "4"}), "submit", "", creates_job=True
    )
    assert isinstance(limited, RateLimited) and limited.retry_after == 4.0
    assert http.error_for(reply(503), "submit", "", creates_job=True).retryable
    # A gateway timeout may hide a job that is running: never silently re-sent.
    assert isinstance(http.error_for(reply(504), "submit", "", creates_job=True), AmbiguousSubmit)
    assert http.error_for(reply(504), "poll", "", creates_job=False).retryable
    assert not http.error_for(reply(401), "submit", "", creates_job=True).retryable


def error_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def test_openai_error_codes() -> None:
    client = OpenAIImagesClient(None, "http://h", "sk-key")  # type: ignore[arg-type]
    quota = error_body("quota", "insufficient_quota", "insufficient_quota")
    error = client._error(reply(429, quota), "generate", idempotent=False)
    assert type(error) is ProviderError and not error.retryable
    blocked = error_body("no", "image_generation_user_error", "moderation_blocked")
    assert isinstance(
        client._error(reply(400, blocked), "generate", idempotent=False), ModerationError
    )
    gateway = client._error(reply(504, b"<html>"), "generate", idempotent=True)
    assert type(gateway) is ProviderError and gateway.retryable


def test_polling_urls_that_may_receive_the_key() -> None:
    assert _same_site("https://api.bfl.ai", "https://api.bfl.ai/v1/get_result?id=1")
    assert _same_site("https://api.bfl.ai", "https://api.eu1.bfl.ai/v1/get_result?id=1")
    assert not _same_site("https://api.bfl.ai", "https://evil.example/x")
    assert not _same_site("https://api.bfl.ai", "http://api.eu1.bfl.ai/x")  # downgrade
    assert not _same_site("https://api.bfl.ai", "https://bfl.ai.evil.example/x")
    assert _same_site("http://127.0.0.1:8299", "http://127.0.0.1:8299/v1/get_result")
    assert not _same_site("http://127.0.0.1:8299", "http://127.0.0.1:9999/v1/get_result")
    assert not _same_site("http://127.0.0.1:8299", "http://127.0.1.1:8299/")


def test_progress_and_base_urls() -> None:
    assert _progress(0.5) == 0.5
    assert _progress(40) == 0.4
    assert _progress(None) is None and _progress(True) is None
    assert api_root("https://api.bfl.ai/v1/") == "https://api.bfl.ai"
    assert api_root("https://relay.example/openai") == "https://relay.example/openai"
