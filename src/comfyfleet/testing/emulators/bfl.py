"""The emulated BFL (FLUX) API: a job per POST /v1/{model}, polled at /v1/get_result."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from comfyfleet.testing.emulators.gates import (
    BFL,
    STATE,
    check_key,
    error,
    file_url,
    hang,
    json_object,
    origin,
    refuse,
    throttled_read,
)
from comfyfleet.testing.emulators.png import bfl_size, colour
from comfyfleet.testing.emulators.state import EmulatorState, Task, body_hash, key_label


async def create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model = request.match_info["model"]
    key = request.headers.get("x-key")
    if denied := check_key(state, key, BFL):
        return denied
    body = await json_object(request)
    if body is None:
        return error(BFL, 422, "body must be a JSON object", "", "")
    label = key_label(key)
    if refused := refuse(request, state, label, BFL):
        return refused
    state.count_job(label, model, body_hash(model, body))
    task = _new_task(state, label, model, body)
    if await hang(state):
        return web.Response(status=503)
    polling_url = f"{origin(request)}/v1/get_result?id={task.id}"
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


async def result(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := check_key(state, request.headers.get("x-key"), BFL):
        return denied
    state.counts["polls"] += 1
    if throttled := throttled_read(state, BFL, "throttle_next_polls"):
        return throttled
    if state.take("fail_next_polls"):
        return error(BFL, 500, "emulated server error", "", "")
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
    result = {"sample": file_url(request, task.file), "width": width, "height": height}
    return {**view, "status": "Ready", "result": result, "progress": 1.0}


async def cancel(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if denied := check_key(state, request.headers.get("x-key"), BFL):
        return denied
    state.counts["cancels"] += 1
    task = state.tasks.get(request.query.get("id", ""))
    if task is None:
        return error(BFL, 404, "Task not found", "", "")
    if task.ready_at > state.clock():
        task.cancelled = True
    return web.json_response({"id": task.id, "cancelled": task.cancelled})
