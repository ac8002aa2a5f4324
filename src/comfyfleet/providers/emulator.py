"""A local stand-in for the BFL and OpenAI image APIs, for tests and load trials.

It speaks both protocols on one port, with dials for latency, failures, rate
limits, hangs and moderation, and counts every job it accepts so a test can
prove that nothing was paid for twice (`GET /_emulator/stats`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
import uuid
from typing import Any

from aiohttp import web

from comfyfleet.providers.emulator_png import bfl_size, colour, openai_size
from comfyfleet.providers.emulator_state import (
    EmulatorSettings,
    EmulatorState,
    Task,
    body_hash,
    key_label,
)

STATE: web.AppKey[EmulatorState] = web.AppKey("emulator_state", EmulatorState)

BFL, OPENAI = "bfl", "openai"
_MAX_UPLOAD = 64 * 1024 * 1024


def build_emulator_app(settings: EmulatorSettings | None = None) -> web.Application:
    app = web.Application(client_max_size=_MAX_UPLOAD)
    app[STATE] = EmulatorState(settings or EmulatorSettings())
    app.router.add_post("/v1/images/generations", openai_generate)
    app.router.add_post("/v1/images/edits", openai_edit)
    app.router.add_get("/v1/get_result", bfl_result)
    app.router.add_post("/v1/cancel", bfl_cancel)
    app.router.add_delete("/v1/cancel", bfl_cancel)
    app.router.add_post("/v1/{model}", bfl_create)
    app.router.add_get("/_emulator/files/{name}", serve_file)
    app.router.add_get("/_emulator/stats", stats)
    app.router.add_post("/_emulator/reset", reset)
    app.on_shutdown.append(_release_hung_requests)
    return app


def emulator_state(app: web.Application) -> EmulatorState:
    return app[STATE]


async def _release_hung_requests(app: web.Application) -> None:
    # Hung handlers wait on this; without it shutdown would wait out their timeout.
    app[STATE].stop()


# --- shared gates -------------------------------------------------------------


def _error(flavour: str, status: int, message: str, code: str, kind: str) -> web.Response:
    if flavour == BFL:
        return web.json_response({"detail": message}, status=status)
    error = {"message": message, "type": kind, "code": code}
    return web.json_response({"error": error}, status=status)


def _check_key(state: EmulatorState, key: str | None, flavour: str) -> web.Response | None:
    keys = state.settings.keys
    if not keys or key in keys:
        return None
    state.counts["unauthorized"] += 1
    if not key:
        return _error(flavour, 401, "missing API key", "missing_api_key", "invalid_request_error")
    # Unlike some real APIs, the emulator never echoes any part of a wrong key.
    return _error(flavour, 403, "invalid API key", "invalid_api_key", "invalid_request_error")


def _refuse(
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
        return _error(flavour, 500, "emulated server error", "server_error", "server_error")
    wait = 1.0 if state.chance(state.settings.throttle_rate) else state.rate_limited(label)
    if wait is None:
        state.create_log.append((now, request.path, 200))
        return None
    state.counts["rate_limited"] += 1
    state.create_log.append((now, request.path, 429))
    return _too_many(state, flavour, wait)


def _too_many(state: EmulatorState, flavour: str, wait: float) -> web.Response:
    response = _error(flavour, 429, "rate limit reached", "rate_limit_exceeded", "requests")
    if state.settings.send_retry_after:
        response.headers["Retry-After"] = state.retry_after(wait)
    if flavour == OPENAI:
        response.headers["x-ratelimit-remaining-requests"] = "0"
        response.headers["x-ratelimit-reset-requests"] = f"{max(wait, 0.001):.3f}s"
    return response


def _throttled_read(state: EmulatorState, flavour: str, countdown: str = "") -> web.Response | None:
    """A 429 for a poll or download, by countdown or at the random share."""
    if not ((countdown and state.take(countdown)) or state.chance(state.settings.throttle_rate)):
        return None
    state.counts["reads_rate_limited"] += 1
    return _too_many(state, flavour, 1.0)


async def _hang(state: EmulatorState) -> bool:
    """Hold an accepted request until shutdown when a hang is dialled."""
    if not (state.take("hang_next") or state.chance(state.settings.hang_rate)):
        return False
    state.counts["hung"] += 1
    await state.stopping.wait()
    return True


async def _json_object(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _file_url(request: web.Request, name: str) -> str:
    # The signature is decoration: real result URLs carry one, and clients must
    # keep it out of their logs.
    return f"{_origin(request)}/_emulator/files/{name}.png?sig={secrets.token_hex(8)}"


# --- BFL ----------------------------------------------------------------------


async def bfl_create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model = request.match_info["model"]
    key = request.headers.get("x-key")
    if denied := _check_key(state, key, BFL):
        return denied
    body = await _json_object(request)
    if body is None:
        return _error(BFL, 422, "body must be a JSON object", "", "")
    label = key_label(key)
    if refused := _refuse(request, state, label, BFL):
        return refused
    state.count_job(label, model, body_hash(model, body))
    task = _new_task(state, label, model, body)
    if await _hang(state):
        return web.Response(status=503)
    polling_url = f"{_origin(request)}/v1/get_result?id={task.id}"
    return web.json_response({"id": task.id, "polling_url": polling_url})


def _new_task(state: EmulatorState, label: str, model: str, body: dict[str, Any]) -> Task:
    seed = body.get("seed")
    if seed is None:
        seed = state.rng.randrange(2**32)  # as the real API does when no seed is given
    if state.chance(state.settings.moderation_rate):
        outcome = "Content Moderated"
    elif state.chance(state.settings.error_rate):
        outcome = "Error"
    else:
        outcome = "Ready"
    duration = state.duration()
    task = Task(
        id=str(uuid.uuid4()),
        key=label,
        model=model,
        ready_at=state.clock() + duration,
        duration=duration,
        outcome=outcome,
        size=bfl_size(body),
        rgb=colour(str(body.get("prompt", "")), seed),
    )
    if outcome == "Ready":
        task.png = state.render(task.size, task.rgb, after=duration / 2)
    state.tasks[task.id] = task
    return task


async def bfl_result(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := _check_key(state, request.headers.get("x-key"), BFL):
        return denied
    state.counts["polls"] += 1
    if throttled := _throttled_read(state, BFL, "throttle_next_polls"):
        return throttled
    if state.take("fail_next_polls"):
        return _error(BFL, 500, "emulated server error", "", "")
    task_id = request.query.get("id", "")
    task = state.tasks.get(task_id)
    if task is None:
        return web.json_response({"id": task_id, "status": "Task not found", "result": None})
    return web.json_response(_task_view(request, state, task))


def _task_view(request: web.Request, state: EmulatorState, task: Task) -> dict[str, Any]:
    view: dict[str, Any] = {"id": task.id, "status": "Pending", "result": None, "progress": None}
    if task.cancelled:
        # Not a status the public API documents: the emulator's cancel is its own.
        return {**view, "status": "Cancelled"}
    left = task.ready_at - state.clock()
    if left > 0:
        done = 1.0 - left / task.duration if task.duration else 0.0
        return {**view, "progress": round(max(0.0, done), 3)}
    if task.outcome != "Ready":
        if task.outcome == "Content Moderated":
            state.counts["moderated"] += 1
        return {**view, "status": task.outcome, "details": {"emulated": task.outcome}}
    if task.file is None:
        # The URL's lifetime starts when the result is first handed out, as a signed URL's would.
        task.file = state.add_file(task.size, task.rgb, task.png)
    width, height = task.size
    result = {"sample": _file_url(request, task.file), "width": width, "height": height}
    return {**view, "status": "Ready", "result": result, "progress": 1.0}


async def bfl_cancel(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := _check_key(state, request.headers.get("x-key"), BFL):
        return denied
    state.counts["cancels"] += 1
    task = state.tasks.get(request.query.get("id", ""))
    if task is None:
        return _error(BFL, 404, "Task not found", "", "")
    if task.ready_at > state.clock():
        task.cancelled = True
    return web.json_response({"id": task.id, "cancelled": task.cancelled})


async def serve_file(request: web.Request) -> web.Response:
    state = request.app[STATE]
    image = state.files.get(request.match_info["name"].removesuffix(".png"))
    if image is None:
        return web.Response(status=404, text="no such file")
    if state.clock() > image.expires_at:
        return web.Response(status=403, text="this result URL has expired")
    if throttled := _throttled_read(state, BFL):
        return throttled
    state.counts["downloads"] += 1
    return web.Response(body=await image.png, content_type="image/png")


# --- OpenAI -------------------------------------------------------------------


def _bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _count(body: dict[str, Any]) -> int | None:
    try:
        n = int(body.get("n", 1))
    except (TypeError, ValueError):
        return None
    return n if 1 <= n <= 10 else None


async def openai_generate(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = _bearer(request)
    if denied := _check_key(state, key, OPENAI):
        return denied
    body = await _json_object(request)
    if body is None or not isinstance(body.get("prompt"), str) or _count(body) is None:
        return _invalid("a JSON body with a prompt and 1 <= n <= 10 is required")
    label = key_label(key)
    if refused := _refuse(request, state, label, OPENAI):
        return refused
    state.count_job(label, str(body.get("model", "")), body_hash("generations", body))
    seed = f"{body['prompt']}\0{body.get('seed')}"
    return await _openai_answer(request, state, body, seed)


async def openai_edit(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = _bearer(request)
    if denied := _check_key(state, key, OPENAI):
        return denied
    form = await request.post()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    images = [
        v.file.read()
        for k, v in form.items()
        if k in ("image", "image[]") and isinstance(v, web.FileField)
    ]
    mask = form.get("mask")
    if not images or "prompt" not in fields or _count(fields) is None:
        return _invalid("multipart image[] files and a prompt are required")
    digests = [hashlib.sha256(data).hexdigest() for data in images]
    if isinstance(mask, web.FileField):
        digests.append("mask:" + hashlib.sha256(mask.file.read()).hexdigest())
    label = key_label(key)
    if refused := _refuse(request, state, label, OPENAI):
        return refused
    state.count_job(label, fields.get("model", ""), body_hash("edits", [fields, digests]))
    return await _openai_answer(request, state, fields, f"{fields['prompt']}\0{digests}")


def _invalid(message: str) -> web.Response:
    return _error(OPENAI, 400, message, "invalid_request", "invalid_request_error")


async def _openai_answer(
    request: web.Request, state: EmulatorState, body: dict[str, Any], seed: str
) -> web.Response:
    """Hold the request for the job's duration, then answer as the synchronous API does."""
    if await _hang(state):
        return web.Response(status=503)
    duration = state.duration()
    size = openai_size(body.get("size"))
    rgbs = [colour(seed, None, index) for index in range(_count(body) or 1)]
    pngs = [state.render(size, rgb, after=duration / 2) for rgb in rgbs]
    try:
        await asyncio.wait_for(state.stopping.wait(), timeout=duration)
        return web.Response(status=503)  # shutting down
    except TimeoutError:
        pass
    if state.chance(state.settings.moderation_rate):
        state.counts["moderated"] += 1
        message = "Your request was rejected by the safety system."
        return _error(OPENAI, 400, message, "moderation_blocked", "image_generation_user_error")
    as_url = body.get("response_format") == "url"
    data = []
    for index, png in enumerate(pngs):
        if as_url:
            data.append({"url": _file_url(request, state.add_file(size, rgbs[index], png))})
        else:
            data.append({"b64_json": base64.b64encode(await png).decode("ascii")})
    return web.json_response({"created": int(time.time()), "data": data})


# --- test hooks ---------------------------------------------------------------


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].stats())


async def reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return web.json_response({"reset": True})
