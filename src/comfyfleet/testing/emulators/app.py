"""A local stand-in for the paid APIs the provider nodes speak, for tests and load trials.

It speaks every emulated protocol on one port (BFL, OpenAI images, OpenAI
videos: one module each), with dials for latency, failures, rate limits, hangs
and moderation, and counts every job it accepts so a test can prove that
nothing was paid for twice (`GET /_emulator/stats`).
"""

from __future__ import annotations

from aiohttp import web

from comfyfleet.testing.emulators import bfl, openai_images, openai_videos
from comfyfleet.testing.emulators.gates import STATE, serve_file
from comfyfleet.testing.emulators.state import EmulatorSettings, EmulatorState

_MAX_UPLOAD = 64 * 1024 * 1024


def build_emulator_app(settings: EmulatorSettings | None = None) -> web.Application:
    app = web.Application(client_max_size=_MAX_UPLOAD)
    app[STATE] = EmulatorState(settings or EmulatorSettings())
    app.router.add_post("/v1/images/generations", openai_images.generate)
    app.router.add_post("/v1/images/edits", openai_images.edit)
    # Before BFL's POST /v1/{model}, which would take /v1/videos for a model name.
    app.router.add_post("/v1/videos", openai_videos.create)
    app.router.add_get("/v1/videos/{video_id}", openai_videos.retrieve)
    app.router.add_delete("/v1/videos/{video_id}", openai_videos.delete)
    app.router.add_get("/v1/videos/{video_id}/content", openai_videos.content)
    app.router.add_get("/v1/get_result", bfl.result)
    app.router.add_post("/v1/cancel", bfl.cancel)
    app.router.add_delete("/v1/cancel", bfl.cancel)
    app.router.add_post("/v1/{model}", bfl.create)
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


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].stats())


async def reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return web.json_response({"reset": True})
