"""The fleet admin API: list, add, drain, resume and remove ComfyUI backends at run time;
the gateways sharing the store; the tenants' shares of the slots."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from comfyfleet.domain.backend_names import FleetError
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.lanes.fleet import parse_spec, spec_json
from comfyfleet.scheduler.fair_share import TenantShare
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.plumbing.client_json import read_json
from comfyfleet.server.plumbing.routing import Route


def _error(status: int, type_: str, message: str) -> web.Response:
    body = {"error": {"type": type_, "message": message, "details": "", "extra_info": {}}}
    return web.json_response(body, status=status)


def backend_up(lane: ComfyUILane) -> bool:
    """Connected, sorted out (what an earlier connection left there) and not held (a
    managed process starting or being recycled takes no work): what the admin API and
    metrics call up, draining or not. Once up, it validates and takes work."""
    return lane.up and not lane.held


def backend_state(gw: Gateway, lane: ComfyUILane) -> str:
    """up, down, draining, or elsewhere (another gateway dispatches to it): one answer
    for the admin API and the dashboard."""
    if not gw.owners.owns(lane.spec.name):
        return "elsewhere"  # another gateway dispatches to it (or none does yet)
    return "draining" if lane.draining else ("up" if backend_up(lane) else "down")


def backend_json(gw: Gateway, lane: ComfyUILane) -> dict[str, Any]:
    answer = {
        **spec_json(lane.spec),
        "lane": lane.name,
        "owner": gw.owners.owner_of(lane.spec.name),
        "state": backend_state(gw, lane),
        "suspect": lane.suspect,
        "validates": lane.validates,
        "node_classes": len(lane.capabilities.object_info),
        "model_files": {k: len(v) for k, v in lane.capabilities.models.items() if v},
        "running": gw.scheduler.runs_on(lane.name),
        "reserved": gw.scheduler.reserved_for(lane.name),
    }
    managed = gw.managed.status(lane.spec.name)
    if managed is not None:
        answer["managed"] = managed
    return answer


def _lane(gw: Gateway, request: web.Request) -> ComfyUILane:
    lane = gw.fleet.backends.get(request.match_info["name"])
    if lane is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": {"type": "not_found", "message": "No such backend"}}),
            content_type="application/json",
        )
    return lane


async def list_backends(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    return web.json_response(
        {"backends": [backend_json(gw, b) for b in gw.fleet.backends.values()]}
    )


async def add_backend(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    try:
        spec = parse_spec(await read_json(request))
    except FleetError as exc:
        return _error(400, "invalid_backend", str(exc))
    if spec.name in gw.fleet.backends:
        return _error(409, "backend_exists", f"backend {spec.name} already exists")
    # A secret is never written to the store: an auth header is kept only as `env:NAME`;
    # a literal one works until the next restart.
    stored = spec_json(spec, secrets=spec.auth_is_reference)
    if spec.auth_header and not spec.auth_is_reference:
        stored.pop("auth_header")
    await gw.store.save_backend(spec.name, stored)
    lane = gw.fleet.backend_lane(spec)
    await gw.owners.tick()  # this gateway's if its fair share allows; the others see it too
    answer = backend_json(gw, lane)
    if spec.auth_header and not spec.auth_is_reference:
        answer["warning"] = "the auth header is kept in memory only; use env:NAME to keep it"
    return web.json_response(answer, status=201)


async def remove_backend(request: web.Request) -> web.Response:
    """Drain, then remove: running jobs get `timeout` seconds (default 30), then move."""
    gw = request.app[GATEWAY]
    lane = _lane(gw, request)
    if lane.worker is not None:  # the worker would only come back: it leaves by itself
        message = f"{lane.spec.name} is a worker's lane: stop the worker, or revoke its token"
        return _error(409, "worker_lane", message)
    try:
        timeout = float(request.query.get("timeout", 30))
    except ValueError:
        timeout = math.nan
    if not 0 <= timeout < math.inf:  # NaN, negative and infinite waits are refused too
        return _error(400, "invalid_query", "timeout must be a number of seconds")
    lane.draining = True
    if gw.owners.owns(lane.spec.name):
        await gw.scheduler.remove_lane(lane.name, timeout)
    else:  # its owner drains it once it sees it gone from the store
        await lane.close()
    await gw.owners.forget(lane.spec.name)
    await gw.managed.remove(lane.spec.name)  # a managed one's process stops too
    await gw.fleet.forget(lane.spec.name)
    await gw.store.delete_backend(lane.spec.name)
    return web.json_response({"removed": lane.spec.name})


def _elsewhere(gw: Gateway, lane: ComfyUILane) -> web.Response | None:
    """The answer to a drain or resume of a backend another gateway dispatches to."""
    if gw.owners.owns(lane.spec.name):
        return None
    owner = gw.owners.owner_of(lane.spec.name)
    where = f"gateway {owner}" if owner else "no gateway yet"
    message = f"backend {lane.spec.name} is dispatched by {where}: ask that gateway"
    return _error(409, "backend_elsewhere", message)


async def drain_backend(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    lane = _lane(gw, request)
    if (refused := _elsewhere(gw, lane)) is not None:
        return refused
    lane.draining = True
    gw.scheduler.wake()  # idle slots elsewhere take what was set aside for it
    return web.json_response(backend_json(gw, lane))


async def resume_backend(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    lane = _lane(gw, request)
    if (refused := _elsewhere(gw, lane)) is not None:
        return refused
    lane.draining = False
    gw.scheduler.wake()
    return web.json_response(backend_json(gw, lane))


async def list_gateways(request: web.Request) -> web.Response:
    """The gateways sharing this one's store whose lease holds, the backends each owns
    and what each runs; this one's own entry also names its lanes."""
    gw = request.app[GATEWAY]
    me = gw.store.owner
    owned: dict[str, list[str]] = {}
    for owner in await gw.store.backend_owners():
        if owner.owner is not None:
            owned.setdefault(owner.owner, []).append(owner.backend)
    owned.setdefault(me, []).extend(gw.managed.instances)  # its own processes
    listed = []
    for record in await gw.store.gateways():
        entry: dict[str, Any] = {
            "id": record.id,
            "host": record.host,
            "pid": record.pid,
            "url": record.url,
            "started_at": record.started_at,
            "seen_at": record.seen_at,
            "lease_until": record.lease_until,
            "running": record.running,
            "backends": sorted(owned.get(record.id, [])),
            "self": record.id == me,
        }
        if record.id == me:
            entry["lanes"] = [lane.name for lane in gw.scheduler.lanes]
        listed.append(entry)
    return web.json_response({"gateways": listed, "self": me})


async def list_tenants(request: web.Request) -> web.Response:
    """Each tenant's queued and running prompts (fleet-wide), its use of this gateway's
    slots and share of that use, and its settings (see scheduler/fair_share.py)."""
    gw = request.app[GATEWAY]
    return web.json_response(
        {"tenants": await tenants_json(gw, await gw.scheduler.shares.current())}
    )


async def tenants_json(gw: Gateway, shares: list[TenantShare]) -> list[dict[str, Any]]:
    """The tenants' shares, each with its paid jobs and spend of the day (UTC)."""
    spent = await gw.spend_today.of(share.tenant for share in shares)
    rows = []
    for share in shares:
        usage = spent[share.tenant]
        row = share.as_json()
        row["paid_jobs_today"] = usage.paid_jobs
        row["spend_today"] = round(usage.spend, 4)
        rows.append(row)
    return rows


def fleet_routes() -> list[Route]:
    return [
        Route("GET", "/api/fleet/tenants", list_tenants, admin=True),
        Route("GET", "/api/fleet/gateways", list_gateways, admin=True),
        Route("GET", "/api/fleet/backends", list_backends, admin=True),
        Route("POST", "/api/fleet/backends", add_backend, admin=True),
        Route("DELETE", "/api/fleet/backends/{name}", remove_backend, admin=True),
        Route("POST", "/api/fleet/backends/{name}/drain", drain_backend, admin=True),
        Route("POST", "/api/fleet/backends/{name}/resume", resume_backend, admin=True),
    ]
