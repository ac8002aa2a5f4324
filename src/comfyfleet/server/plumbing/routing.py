"""Route tables: every ComfyUI route is served both at `/path` and `/api/path`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    api_alias: bool = True  # also serve under /api
    admin: bool = False  # with authentication on, only admin tokens may call it
    public: bool = False  # with authentication on, no token is needed (the login page)
    page: bool = False  # an HTML page: without a token, the browser is sent to log in


def install(app: web.Application, routes: Iterable[Route]) -> None:
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
        if route.api_alias and not route.path.startswith("/api/"):
            app.router.add_route(route.method, "/api" + route.path, route.handler)


def empty_ok() -> web.Response:
    """ComfyUI's empty 200: no body, and aiohttp then sends no Content-Type."""
    return web.Response(status=200)


async def json_reply(data: Any, *, large: bool) -> web.Response:
    """`web.json_response(data)`, encoded in a worker thread when `large` (a large
    prompt in it, or many): no other client waits on the loop for its encoding."""
    if not large:
        return web.json_response(data)
    text = await asyncio.to_thread(json.dumps, data)
    return web.Response(text=text, content_type="application/json")
