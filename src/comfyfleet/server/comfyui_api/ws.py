"""The WebSocket endpoint `/ws?clientId=`."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from comfyfleet.protocol import events
from comfyfleet.server.access.auth import scope, tenant_name
from comfyfleet.server.comfyui_api.follow import Subscriptions
from comfyfleet.server.delivery.client_events import client_key
from comfyfleet.server.delivery.hub import ClientSocket
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.plumbing.client_json import RefusedJson, loads
from comfyfleet.server.plumbing.routing import Route

log = logging.getLogger(__name__)

#: The largest message a client may send, in bytes. A client sends its `feature_flags`
#: first (a few hundred bytes from ComfyUI's frontend), then perhaps `subscribe` and
#: `unsubscribe` messages (follow.py); 64 KiB leaves room for any flags to come, and parses
#: in well under a millisecond. A larger message closes the socket (1009) as soon as its
#: frame header announces it.
MAX_WS_MESSAGE = 64 * 1024


def server_features(max_upload_bytes: int) -> dict[str, object]:
    return {"supports_preview_metadata": True, "max_upload_size": max_upload_bytes}


async def websocket(request: web.Request) -> web.WebSocketResponse:
    gw = request.app[GATEWAY]
    # No per-message compression: frames are small and are written in batches. aiohttp
    # refuses a message of max_msg_size bytes or more, hence the + 1.
    ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE + 1, compress=False)
    await ws.prepare(request)
    sid = request.query.get("clientId") or uuid.uuid4().hex
    # Addressed by tenant and client id: the same client id of two tenants is two clients.
    tenant = tenant_name(request)
    key = client_key(tenant, sid)
    sock = ClientSocket(key, ws, request.transport)
    subscriptions = Subscriptions(sock, gw, scope(request))
    gw.hub.attach(sock)
    try:
        sock.send_json("status", events.status(gw.scheduler.queue_remaining, sid=sid))
        for event, data in gw.router.catch_up(key):
            sock.send_json(event, data)
        if gw.relay is not None:  # its prompts that other gateways run, from the log
            await gw.relay.connected(tenant, sid)
        first = True
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                parsed = _parsed(message.data)
                if Subscriptions.wanted(parsed):
                    await subscriptions.handle(parsed)
                elif first:  # other messages after the first mean nothing
                    _on_first(sock, parsed, gw.config.max_upload_bytes)
                first = False
            elif message.type == WSMsgType.ERROR:  # e.g. past MAX_WS_MESSAGE: aiohttp closed it
                break
    finally:
        gw.hub.detach(sock)
        if gw.relay is not None:
            gw.relay.disconnected(tenant, sid)
        await subscriptions.close()
        await sock.drain_and_stop()
    return ws


def _parsed(text: str) -> Any:
    try:
        return loads(text)
    except RefusedJson:
        return None


def _on_first(sock: ClientSocket, message: Any, max_upload: int) -> None:
    """Only a first `feature_flags` message means anything; anything else is ignored."""
    if isinstance(message, dict) and message.get("type") == "feature_flags":
        flags = message.get("data")
        if not isinstance(flags, dict):
            flags = {}
        sock.supports_preview_metadata = bool(flags.get("supports_preview_metadata"))
        sock.send_json("feature_flags", server_features(max_upload))


def ws_routes() -> list[Route]:
    return [Route("GET", "/ws", websocket)]
