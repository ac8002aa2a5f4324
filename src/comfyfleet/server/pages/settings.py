"""`/settings`: the editor's settings, one JSON file per tenant, as ComfyUI keeps them.

The file is `comfy.settings.json` in the tenant's user folder (ComfyUI's name, so a
ComfyUI user folder can be copied in). Changes are read-modify-write of the whole file:
one lock per file keeps two concurrent changes from losing one another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiohttp import web

from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.pages.userdata import UserDirOf, locate, write_file
from comfyfleet.server.plumbing.client_json import RefusedJson, loads
from comfyfleet.server.plumbing.routing import Route, empty_ok

log = logging.getLogger(__name__)

SETTINGS_FILE = "comfy.settings.json"
#: Bytes the settings of one tenant may take (the editor's are a few KiB).
MAX_SETTINGS_BYTES = 4 * 1024 * 1024


def read_settings(user_dir: Path) -> dict[str, Any]:
    """The settings in `user_dir`; {} when there are none, or they are unreadable."""
    path = locate(user_dir, SETTINGS_FILE)
    if path is None or not os.path.isfile(path):
        return {}
    try:
        value = loads(path.read_bytes())
    except (OSError, RefusedJson):
        log.error("the settings file %s is unreadable: starting from none", path)
        return {}
    return value if isinstance(value, dict) else {}


def write_settings(user_dir: Path, settings: dict[str, Any]) -> bool:
    """Store `settings`; False when they are past MAX_SETTINGS_BYTES."""
    body = json.dumps(settings, indent=4).encode()
    if len(body) > MAX_SETTINGS_BYTES:
        return False
    path = locate(user_dir, SETTINGS_FILE)
    if path is None:
        raise OSError(f"{SETTINGS_FILE} leads out of {user_dir}")
    write_file(path, body, overwrite=True)
    return True


def _bad_body(message: str) -> web.Response:
    body = prompt_error_body(error("invalid_json", message))
    return web.json_response(body, status=400)


class _Locks:
    def __init__(self) -> None:
        self._locks: defaultdict[Path, asyncio.Lock] = defaultdict(asyncio.Lock)

    def of(self, user_dir: Path) -> asyncio.Lock:
        return self._locks[user_dir]


def settings_routes(user_dir_of: UserDirOf) -> list[Route]:
    locks = _Locks()

    async def get_all(request: web.Request) -> web.StreamResponse:
        return web.json_response(await asyncio.to_thread(read_settings, user_dir_of(request)))

    async def get_one(request: web.Request) -> web.StreamResponse:
        settings = await asyncio.to_thread(read_settings, user_dir_of(request))
        return web.json_response(settings.get(request.match_info["id"]))

    async def post_all(request: web.Request) -> web.StreamResponse:
        changes = await _body(request)
        if not isinstance(changes, dict):
            return _bad_body("Settings must be a JSON object")
        return await _change(locks, user_dir_of(request), lambda old: {**old, **changes})

    async def post_one(request: web.Request) -> web.StreamResponse:
        value = await _body(request)
        key = request.match_info["id"]
        return await _change(locks, user_dir_of(request), lambda old: {**old, key: value})

    return [
        Route("GET", "/settings", get_all),
        Route("GET", "/settings/{id}", get_one),
        Route("POST", "/settings", post_all),
        Route("POST", "/settings/{id}", post_one),
    ]


async def _body(request: web.Request) -> Any:
    """The body as JSON (an empty one is not a value); HTTP 400 otherwise."""
    raw = await request.read()
    try:
        return loads(raw)
    except RefusedJson as refused:
        raise web.HTTPBadRequest(
            text=json.dumps(
                prompt_error_body(error("invalid_json", refused.message, refused.details))
            ),
            content_type="application/json",
        ) from None


async def _change(locks: _Locks, user_dir: Path, update: Any) -> web.StreamResponse:
    async with locks.of(user_dir):
        settings = await asyncio.to_thread(read_settings, user_dir)
        if not await asyncio.to_thread(write_settings, user_dir, update(settings)):
            return web.Response(status=413)
    return empty_ok()
