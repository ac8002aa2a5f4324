"""The emulated OpenAI images API: synchronous generations and edits."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from typing import Any

from aiohttp import web

from comfyfleet.testing.emulators.gates import (
    OPENAI,
    STATE,
    bearer,
    check_key,
    error,
    file_url,
    hang,
    json_object,
    refuse,
)
from comfyfleet.testing.emulators.png import colour, openai_size
from comfyfleet.testing.emulators.state import EmulatorState, body_hash, key_label


def _count(body: dict[str, Any]) -> int | None:
    try:
        n = int(body.get("n", 1))
    except (TypeError, ValueError):
        return None
    return n if 1 <= n <= 10 else None


async def generate(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = bearer(request)
    if denied := check_key(state, key, OPENAI):
        return denied
    body = await json_object(request)
    if body is None or not isinstance(body.get("prompt"), str) or _count(body) is None:
        return _invalid("a JSON body with a prompt and 1 <= n <= 10 is required")
    label = key_label(key)
    if refused := refuse(request, state, label, OPENAI):
        return refused
    state.count_job(label, str(body.get("model", "")), body_hash("generations", body))
    seed = f"{body['prompt']}\0{body.get('seed')}"
    return await _openai_answer(request, state, body, seed)


async def edit(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = bearer(request)
    if denied := check_key(state, key, OPENAI):
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
    if refused := refuse(request, state, label, OPENAI):
        return refused
    state.count_job(label, fields.get("model", ""), body_hash("edits", [fields, digests]))
    return await _openai_answer(request, state, fields, f"{fields['prompt']}\0{digests}")


def _invalid(message: str) -> web.Response:
    return error(OPENAI, 400, message, "invalid_request", "invalid_request_error")


async def _openai_answer(
    request: web.Request, state: EmulatorState, body: dict[str, Any], seed: str
) -> web.Response:
    """Hold the request for the job's duration, then answer as the synchronous API does."""
    if await hang(state):
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
        return error(OPENAI, 400, message, "moderation_blocked", "image_generation_user_error")
    as_url = body.get("response_format") == "url"
    data = []
    for index, png in enumerate(pngs):
        if as_url:
            data.append({"url": file_url(request, state.add_file(size, rgbs[index], png))})
        else:
            data.append({"b64_json": base64.b64encode(await png).decode("ascii")})
    return web.json_response({"created": int(time.time()), "data": data})
