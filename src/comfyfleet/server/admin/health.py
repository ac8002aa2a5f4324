"""Probes for a load balancer or Kubernetes: `/healthz` (the process answers) and
`/readyz` (it can take work: started, not stopping, its store answers and, with other
gateways on the store, it holds its lease). Neither needs a token nor tells anything
but yes or no and why."""

from __future__ import annotations

import asyncio

from aiohttp import web

from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.store.base import StoreError

#: How long the store may take to answer a readiness probe (s).
STORE_TIMEOUT = 2.0


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    problems = []
    if not gateway.serving:
        problems.append("starting or stopping")
    try:
        await asyncio.wait_for(gateway.store.ping(), STORE_TIMEOUT)
    except (StoreError, TimeoutError):
        problems.append("the store does not answer")
    if not gateway.scheduler.lease_guard.held:
        problems.append("this gateway cannot prove its lease")
    if problems:
        headers = {"Retry-After": str(max(1, round(gateway.config.lease / 3)))}
        body = {"status": "unavailable", "problems": problems}
        return web.json_response(body, status=503, headers=headers)
    return web.json_response({"status": "ready"})


def health_routes() -> list[Route]:
    return [
        Route("GET", "/healthz", healthz, api_alias=False, public=True),
        Route("GET", "/readyz", readyz, api_alias=False, public=True),
    ]
