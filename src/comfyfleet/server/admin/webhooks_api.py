"""The webhook deliveries API: list the outbox (the dead-letter list among it) and send a
delivery again by id. Admin-only when authentication is on."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from comfyfleet.domain.webhooks import DeliveryState, WebhookDelivery
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.server.comfyui_api.prompts import clamp_to_sql
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.jobs_api.jobs import DEFAULT_LIMIT, MAX_LIMIT, page
from comfyfleet.server.plumbing.routing import Route

_redact = Redactor()


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def delivery_json(delivery: WebhookDelivery, *, with_body: bool = False) -> dict[str, Any]:
    pending = delivery.state == DeliveryState.PENDING
    answer: dict[str, Any] = {
        "id": delivery.id,
        "prompt_id": delivery.prompt_id,
        "tenant": delivery.tenant,
        "event": delivery.event.value,
        "target": delivery.target,  # None: the prompt's own webhook_url
        "url": _redact.url(delivery.url),  # a query string may hold a token
        "state": delivery.state.value,
        "attempts": delivery.attempts,
        "create_time": _ms(delivery.created_at),
        "next_attempt_time": _ms(delivery.next_at) if pending else None,
        "delivered_time": _ms(delivery.delivered_at),
        "last_status": delivery.last_status,
        "last_error": delivery.last_error,
    }
    if with_body:
        answer["body"] = None if delivery.body is None else json.loads(delivery.body)
    return answer


def _error(status: int, type_: str, message: str) -> web.Response:
    body = {"error": {"type": type_, "message": message, "details": "", "extra_info": {}}}
    return web.json_response(body, status=status)


async def list_deliveries(request: web.Request) -> web.Response:
    query = request.query
    state = None
    if query.get("state"):
        if query["state"] not in set(DeliveryState):
            names = ", ".join(DeliveryState)
            return _error(400, "invalid_query", f"state must be one of {names}")
        state = DeliveryState(query["state"])
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
        offset = int(query.get("offset", 0))
    except ValueError:
        return _error(400, "invalid_query", "limit and offset must be integers")
    if limit < 1 or offset < 0:
        return _error(400, "invalid_query", "limit must be >= 1 and offset >= 0")
    limit, offset = min(limit, MAX_LIMIT), clamp_to_sql(offset)
    found, total = await request.app[GATEWAY].store.webhook_deliveries(
        state=state, prompt_id=query.get("prompt_id") or None, limit=limit, offset=offset
    )
    deliveries = [delivery_json(d) for d in found]
    return web.json_response(
        {"deliveries": deliveries, "pagination": page(offset, limit, found, total)}
    )


async def get_delivery(request: web.Request) -> web.Response:
    found = await request.app[GATEWAY].store.webhook_delivery(request.match_info["id"])
    if found is None:
        return _error(404, "not_found", "No such delivery")
    return web.json_response(delivery_json(found, with_body=True))


async def retry_delivery(request: web.Request) -> web.Response:
    """A dead (or delivered) delivery sent again, with its id and body, and a fresh retry
    window; 409 while it is still pending."""
    gw = request.app[GATEWAY]
    delivery_id = request.match_info["id"]
    retried = await gw.store.retry_webhook_delivery(delivery_id)
    if retried is None:
        if await gw.store.webhook_delivery(delivery_id) is None:
            return _error(404, "not_found", "No such delivery")
        return _error(409, "delivery_pending", "The delivery is pending already")
    gw.webhooks.wake()
    return web.json_response(delivery_json(retried))


def webhook_routes() -> list[Route]:
    return [
        Route("GET", "/api/webhooks/deliveries", list_deliveries, admin=True),
        Route("GET", "/api/webhooks/deliveries/{id}", get_delivery, admin=True),
        Route("POST", "/api/webhooks/deliveries/{id}/retry", retry_delivery, admin=True),
    ]
