"""The emulated OpenAI videos API: POST /v1/videos makes a job, GET /v1/videos/{id}
reports it, GET /v1/videos/{id}/content downloads the MP4, DELETE removes it."""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

from aiohttp import web

from comfyfleet.testing.emulators.gates import (
    OPENAI,
    STATE,
    bearer,
    check_key,
    error,
    hang,
    refuse,
    throttled_read,
)
from comfyfleet.testing.emulators.mp4 import render_mp4
from comfyfleet.testing.emulators.png import colour
from comfyfleet.testing.emulators.state import EmulatorState, VideoJob, body_hash, key_label

SIZES = frozenset({"720x1280", "1280x720", "1024x1792", "1792x1024", "1920x1080", "1080x1920"})
SECONDS = frozenset({"4", "8", "12", "16", "20"})
DEFAULTS = {"model": "sora-2", "seconds": "4", "size": "720x1280"}
#: Reference images past this are refused, as the real API refuses large uploads.
MAX_REFERENCE = 20 * 1024 * 1024


async def create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = bearer(request)
    if denied := check_key(state, key, OPENAI):
        return denied
    read = await _fields(request)
    if isinstance(read, web.Response):
        return read
    fields, reference = read
    label = key_label(key)
    if refused := refuse(request, state, label, OPENAI):
        return refused
    state.count_job(label, fields["model"], body_hash("videos", [fields, reference]))
    job = _new_job(state, label, fields)
    if await hang(state):
        return web.Response(status=503)
    return web.json_response(_view(state, job))


async def _fields(request: web.Request) -> tuple[dict[str, str], str] | web.Response:
    """The request's fields with defaults, and the reference image's digest ("" for none)."""
    reference = b""
    if request.content_type == "application/json":
        try:
            body: Any = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        given = {k: v for k, v in body.items() if isinstance(v, str)}
    else:
        form = await request.post()
        given = {k: v for k, v in form.items() if isinstance(v, str)}
        upload = form.get("input_reference")
        if isinstance(upload, web.FileField):
            reference = upload.file.read(MAX_REFERENCE + 1)
            if len(reference) > MAX_REFERENCE:
                return _invalid("input_reference is too large")
    fields = {**DEFAULTS, **{k: v for k, v in given.items() if k in (*DEFAULTS, "prompt")}}
    if not fields.get("prompt"):
        return _invalid("prompt is required")
    if fields["seconds"] not in SECONDS:
        return _invalid(f"seconds must be one of {sorted(SECONDS, key=int)}")
    if fields["size"] not in SIZES:
        return _invalid(f"size must be one of {sorted(SIZES)}")
    digest = hashlib.sha256(reference).hexdigest() if reference else ""
    return fields, digest


def _invalid(message: str) -> web.Response:
    return error(OPENAI, 400, message, "invalid_value", "invalid_request_error")


def _new_job(state: EmulatorState, label: str, fields: dict[str, str]) -> VideoJob:
    if state.chance(state.settings.moderation_rate):
        outcome = "moderation_blocked"
    elif state.chance(state.settings.error_rate):
        outcome = "video_generation_failed"
    else:
        outcome = "completed"
    width, _, height = fields["size"].partition("x")
    duration = state.duration()
    job = VideoJob(
        id=f"video_{uuid.uuid4().hex}",
        key=label,
        model=fields["model"],
        created_at=int(time.time()),
        ready_at=state.clock() + duration,
        duration=duration,
        outcome=outcome,
        size=(int(width), int(height)),
        seconds=int(fields["seconds"]),
        rgb=colour(fields["prompt"], None),
    )
    state.videos[job.id] = job
    return job


def _view(state: EmulatorState, job: VideoJob) -> dict[str, Any]:
    width, height = job.size
    view: dict[str, Any] = {
        "id": job.id,
        "object": "video",
        "model": job.model,
        "status": "queued",
        "progress": 0,
        "created_at": job.created_at,
        "completed_at": None,
        "size": f"{width}x{height}",
        "seconds": str(job.seconds),
        "error": None,
    }
    left = job.ready_at - state.clock()
    if left > 0:
        done = 1.0 - left / job.duration if job.duration else 0.0
        status = "in_progress" if done > 0.1 else "queued"
        return {**view, "status": status, "progress": min(99, int(done * 100))}
    finished = {**view, "progress": 100, "completed_at": int(time.time())}
    if job.outcome != "completed":
        if job.outcome == "moderation_blocked":
            state.counts["moderated"] += 1
        message = f"emulated failure: {job.outcome}"
        return {**finished, "status": "failed", "error": {"code": job.outcome, "message": message}}
    return {**finished, "status": "completed"}


def _found(request: web.Request, state: EmulatorState) -> VideoJob | web.Response:
    job = state.videos.get(request.match_info["video_id"])
    if job is None or job.deleted:
        return error(OPENAI, 404, "video not found", "video_not_found", "invalid_request_error")
    return job


async def retrieve(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := check_key(state, bearer(request), OPENAI):
        return denied
    state.counts["polls"] += 1
    if throttled := throttled_read(state, OPENAI, "throttle_next_polls"):
        return throttled
    if state.take("fail_next_polls"):
        return error(OPENAI, 500, "emulated server error", "server_error", "server_error")
    job = _found(request, state)
    if isinstance(job, web.Response):
        return job
    return web.json_response(_view(state, job))


async def content(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := check_key(state, bearer(request), OPENAI):
        return denied
    job = _found(request, state)
    if isinstance(job, web.Response):
        return job
    if job.ready_at > state.clock() or job.outcome != "completed":
        message = "the video is not completed"
        return error(OPENAI, 400, message, "video_not_ready", "invalid_request_error")
    if throttled := throttled_read(state, OPENAI):
        return throttled
    state.counts["downloads"] += 1
    body = render_mp4(*job.size, job.seconds, job.rgb)
    return web.Response(body=body, content_type="video/mp4")


async def delete(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := check_key(state, bearer(request), OPENAI):
        return denied
    state.counts["cancels"] += 1
    job = _found(request, state)
    if isinstance(job, web.Response):
        return job
    job.deleted = True
    job.cancelled = job.ready_at > state.clock()
    return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})
