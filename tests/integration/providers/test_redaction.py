"""A planted key never shows up in an exception, its repr, or a log record."""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from comfyfleet.nodes.providers.bfl.client import BFLClient, SubmittedTask
from comfyfleet.nodes.providers.openai_images.client import OpenAIImagesClient
from comfyfleet.provider_http.errors import ProviderError
from comfyfleet.provider_http.retry import Backoff, Cooldown
from tests.emulators import Emulator
from tests.integration.providers.conftest import KEY

BODY: dict[str, Any] = {"prompt": "x", "width": 32, "height": 32, "seed": 1}


def assert_clean(text: str) -> None:
    assert KEY not in text
    # No recognisable fragment either (a relay might echo a prefix).
    assert KEY[:12] not in text and KEY[-12:] not in text


async def echo_headers(request: web.Request) -> web.Response:
    """A badly behaved relay: echoes the request headers in errors and result URLs."""
    headers = "; ".join(f"{k}: {v}" for k, v in request.headers.items())
    key = request.headers.get("x-key") or request.headers.get("Authorization") or ""
    if request.path.endswith("get_result"):
        sample = f"http://127.0.0.1:1/file.png?key={key.removeprefix('Bearer ')}"
        return web.json_response({"status": "Ready", "result": {"sample": sample}})
    if request.path.endswith("flux-dev"):
        return web.json_response({"id": "t1", "polling_url": f"/v1/get_result?key={key}"})
    error = {"message": f"bad request, you sent {headers}", "type": "x", "code": None}
    return web.json_response({"error": error, "detail": f"you sent {headers}"}, status=400)


@pytest.fixture
async def relay() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo_headers)
    # Its own access log is the remote side's business (and would show its polling
    # URL, key included); what is checked here is what the clients say.
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(access_log=None)
    yield str(server.make_url("")).rstrip("/")
    await server.close()


def fast(**extra: Any) -> dict[str, Any]:
    return {
        "backoff": Backoff(base=0.01, cap=0.01),
        "cooldown": Cooldown(burst=100),
        "max_attempts": 2,
        **extra,
    }


async def failures(
    emulator: Emulator, relay: str, session: aiohttp.ClientSession, port: int
) -> list[Callable[[], Awaitable[Any]]]:
    bfl = BFLClient(session, emulator.url, KEY, poll_interval=0.01, **fast(timeout=0.3))
    relay_bfl = BFLClient(session, relay, KEY, **fast(poll_attempts=2))
    openai = OpenAIImagesClient(session, relay, KEY, **fast())
    refused = BFLClient(session, f"http://127.0.0.1:{port}", KEY, **fast())
    # Keyed URL that does not resolve to anything listening.
    keyed = f"http://127.0.0.1:{port}/x?key={KEY}"

    async def hang() -> Any:
        emulator.settings.hang_next = 1
        return await bfl.submit("flux-dev", BODY)

    async def rate_limited() -> Any:
        emulator.settings.rate_limit = 0.001
        emulator.settings.retry_after = 0.05
        try:
            await bfl.submit("flux-dev", BODY)
            return await bfl.submit("flux-dev", BODY)
        finally:
            emulator.settings.rate_limit = None

    return [
        hang,
        rate_limited,
        lambda: relay_bfl.submit("flux-pro", BODY),  # 400 echoing x-key
        lambda: relay_bfl.run("flux-dev", BODY),  # key in polling and sample URLs
        lambda: openai.generate({"prompt": "x"}),  # 400 echoing the Authorization header
        lambda: refused.submit("flux-dev", BODY),
        lambda: bfl.download(keyed),
        lambda: bfl.poll(SubmittedTask("t", keyed)),
    ]


async def test_planted_key_never_leaks(
    emulator: Emulator,
    relay: str,
    session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    unused_tcp_port: int,
) -> None:
    caplog.set_level(logging.DEBUG)
    cases = await failures(emulator, relay, session, unused_tcp_port)
    for case in cases:
        with pytest.raises(ProviderError) as caught:
            await case()
        error = caught.value
        assert_clean(str(error))
        assert_clean(repr(error))
        assert_clean("".join(traceback.format_exception(error)))
        logging.getLogger("test").error("provider failed", exc_info=error)
    assert len(caplog.records) > len(cases)  # the clients logged their retries too
    for record in caplog.records:
        assert_clean(record.getMessage())
        assert_clean(logging.Formatter().format(record))
    assert_clean(repr(cases))
    assert_clean(str(await emulator.fetch_stats(session)))
