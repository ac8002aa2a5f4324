"""What every emulated API shares: the key check, refusals (500s, 429s, hangs) decided
before a job exists, random 429s on reads, and each API's error shape."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from comfyfleet.testing.emulators.state import EmulatorState

STATE: web.AppKey[EmulatorState] = web.AppKey("emulator_state", EmulatorState)

BFL, OPENAI = "bfl", "openai"


def error(flavour: str, status: int, message: str, code: str, kind: str) -> web.Response:
    if flavour == BFL:
        return web.json_response({"detail": message}, status=status)
    body = {"message": message, "type": kind, "code": code}
    return web.json_response({"error": body}, status=status)


def check_key(state: EmulatorState, key: str | None, flavour: str) -> web.Response | None:
    keys = state.settings.keys
    if not keys or key in keys:
        return None
    state.counts["unauthorized"] += 1
    if not key:
        return error(flavour, 401, "missing API key", "missing_api_key", "invalid_request_error")
    # Unlike some real APIs, the emulator never echoes any part of a wrong key.
    return error(flavour, 403, "invalid API key", "invalid_api_key", "invalid_request_error")


def refuse(
    request: web.Request, state: EmulatorState, label: str, flavour: str
) -> web.Response | None:
    """A 500 or 429 for a job-creating request, decided before any job exists."""
    state.counts["create_requests"] += 1
    now = state.clock()
    if idempotency_key := request.headers.get("Idempotency-Key"):
        state.idempotency_keys[idempotency_key] += 1
    if state.take("fail_next") or state.chance(state.settings.fail_rate):
        state.counts["failed"] += 1
        state.create_log.append((now, request.path, 500))
        return error(flavour, 500, "emulated server error", "server_error", "server_error")
    wait = 1.0 if state.chance(state.settings.throttle_rate) else state.rate_limited(label)
    if wait is None:
        state.create_log.append((now, request.path, 200))
        return None
    state.counts["rate_limited"] += 1
    state.create_log.append((now, request.path, 429))
    return too_many(state, flavour, wait)


def too_many(state: EmulatorState, flavour: str, wait: float) -> web.Response:
    response = error(flavour, 429, "rate limit reached", "rate_limit_exceeded", "requests")
    if state.settings.send_retry_after:
        response.headers["Retry-After"] = state.retry_after(wait)
    if flavour == OPENAI:
        response.headers["x-ratelimit-remaining-requests"] = "0"
        response.headers["x-ratelimit-reset-requests"] = f"{max(wait, 0.001):.3f}s"
    return response


def throttled_read(state: EmulatorState, flavour: str, countdown: str = "") -> web.Response | None:
    """A 429 for a poll or download, by countdown or at the random share."""
    if not ((countdown and state.take(countdown)) or state.chance(state.settings.throttle_rate)):
        return None
    state.counts["reads_rate_limited"] += 1
    return too_many(state, flavour, 1.0)


async def hang(state: EmulatorState) -> bool:
    """Hold an accepted request until shutdown when a hang is dialled."""
    if not (state.take("hang_next") or state.chance(state.settings.hang_rate)):
        return False
    state.counts["hung"] += 1
    await state.stopping.wait()
    return True


async def json_object(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def file_url(request: web.Request, name: str) -> str:
    # The signature is decoration: real result URLs carry one, and clients must
    # keep it out of their logs.
    return f"{origin(request)}/_emulator/files/{name}.png?sig={secrets.token_hex(8)}"


def bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def serve_file(request: web.Request) -> web.Response:
    state = request.app[STATE]
    image = state.files.get(request.match_info["name"].removesuffix(".png"))
    if image is None:
        return web.Response(status=404, text="no such file")
    if state.clock() > image.expires_at:
        return web.Response(status=403, text="this result URL has expired")
    if throttled := throttled_read(state, BFL):
        return throttled
    state.counts["downloads"] += 1
    return web.Response(body=await image.png, content_type="image/png")
