"""Cancels and interrupts of jobs wherever they run in the fleet.

A gateway stops only the attempts it runs itself (its scheduler's). A job the store says
another live gateway runs is passed to that gateway (its owner) with a signed request,
`POST /comfyfleet/peer/cancel`, which cancels or interrupts it exactly as a cancel
received there does. That route takes only a peer gateway's signature and acts on this
gateway's own running jobs only: a peer's request is never passed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from comfyfleet.domain.jobs import JobStatus
from comfyfleet.peers.cancel import HOW
from comfyfleet.peers.signing import PEER_CANCEL_ROUTE
from comfyfleet.server.access.peer_requests import peer_refusal, refusal
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.tenants import DEFAULT_TENANT, check_tenant_name

#: The longest prompt id a peer's request may name.
MAX_ID = 200


async def cancel_anywhere(gw: Gateway, prompt_ids: Sequence[str]) -> list[str]:
    """Cancel these jobs (the caller has checked they are its tenant's): pending ones
    leave the queue, running ones are interrupted here or by the gateway running them
    and end cancelled. The ids cancelled."""
    cancelled = await gw.scheduler.cancel(prompt_ids)
    done = set(cancelled)
    rest = [p for p in prompt_ids if p not in done]
    return cancelled + await _elsewhere(gw, rest, "cancel")


async def interrupt_anywhere(gw: Gateway, prompt_id: str) -> list[str]:
    """Interrupt this running job (the caller's tenant's), here or where it runs."""
    return gw.scheduler.interrupt(prompt_id) or await _elsewhere(gw, [prompt_id], "interrupt")


async def _elsewhere(gw: Gateway, prompt_ids: Sequence[str], how: str) -> list[str]:
    """Ask the owners of those of these jobs other gateways run; the ids they stopped."""
    if not gw.store.shared or not prompt_ids:
        return []  # no other gateway runs anything
    wanted = list(dict.fromkeys(prompt_ids))
    jobs = await asyncio.gather(*(gw.store.get(prompt_id) for prompt_id in wanted))
    asked: list[str] = []
    asks: list[Coroutine[Any, Any, bool]] = []
    for prompt_id, job in zip(wanted, jobs, strict=True):
        if job is None or job.status is not JobStatus.RUNNING or job.owner is None:
            continue
        if job.owner == gw.identity.id:
            continue  # ours: the scheduler has answered for it
        asked.append(prompt_id)
        asks.append(gw.peer_cancels.ask(job.owner, job.tenant, prompt_id, how))
    # At once, so several owners that do not answer cost one timeout, not one each.
    done = await asyncio.gather(*asks)
    return [prompt_id for prompt_id, ok in zip(asked, done, strict=True) if ok]


def cancelling(gw: Gateway, prompt_id: str) -> bool:
    """Whether a cancelled job is stopping: here, or on its owner, asked from here."""
    return gw.scheduler.cancelling(prompt_id) or gw.peer_cancels.cancelling(prompt_id)


def peer_cancel_routes() -> list[Route]:
    async def peer_cancel(request: web.Request) -> web.Response:
        """`POST /comfyfleet/peer/cancel?tenant=&prompt_id=&how=cancel|interrupt`, signed
        by a peer gateway: stop that job of that tenant if it runs here."""
        gw = request.app[GATEWAY]
        refused = await peer_refusal(request, gw.store, gw.peer_key, gw.identity.id)
        if refused is not None:
            return refused
        query = request.rel_url.query
        prompt_id, how = query.get("prompt_id", ""), query.get("how", "")
        if how not in HOW or not 0 < len(prompt_id) <= MAX_ID:
            return refusal(400, "invalid_request", "Name a prompt_id and how: cancel or interrupt")
        try:
            tenant = check_tenant_name(query.get("tenant", DEFAULT_TENANT))
        except ValueError:
            return refusal(400, "invalid_tenant", "Not a tenant name")
        job = gw.scheduler.running_job(prompt_id)
        if job is None or job.tenant != tenant:
            return web.json_response({"cancelled": []})  # not running here (any more)
        if how == "cancel":
            stopped = await gw.scheduler.cancel([prompt_id])
        else:
            stopped = gw.scheduler.interrupt(prompt_id)
        return web.json_response({"cancelled": stopped})

    # public: no user token (the signature is the check); left out of docs/openapi.json.
    return [Route("POST", PEER_CANCEL_ROUTE, peer_cancel, api_alias=False, public=True)]
