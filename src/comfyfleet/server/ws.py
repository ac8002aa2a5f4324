"""The WebSocket endpoint `/ws?clientId=`."""

from __future__ import annotations

import logging
import uuid

from aiohttp import WSMsgType, web

from comfyfleet.protocol import events
from comfyfleet.server.auth import tenant_name
from comfyfleet.server.client_events import client_key
from comfyfleet.server.client_json import RefusedJson, loads
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.hub import ClientSocket
from comfyfleet.server.routing import Route

log = logging.getLogger(__name__)

#: The largest message a client may send, in bytes. The protocol reads one message from a
#: client, its first (`feature_flags`, a few hundred bytes from ComfyUI's frontend); 64 KiB
#: leaves room for any flags to come, and parses in well under a millisecond. A larger
#: message closes the socket (1009) as soon as its frame header announces it.
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
    key = client_key(tenant_name(request), sid)
    sock = ClientSocket(key, ws, request.transport)
    gw.hub.attach(sock)
    try:
        sock.send_json("status", events.status(gw.scheduler.queue_remaining, sid=sid))
        for event, data in gw.router.catch_up(key):
            sock.send_json(event, data)
        first = True
        async for message in ws:
            if message.type == WSMsgType.TEXT and first:  # later ones mean nothing: unread
                _on_first_text(sock, message.data, gw.config.max_upload_bytes)
                first = False
            elif message.type == WSMsgType.ERROR:  # e.g. past MAX_WS_MESSAGE: aiohttp closed it
                break
    finally:
        gw.hub.detach(sock)
        await sock.drain_and_stop()
    return ws


def _on_first_text(sock: ClientSocket, text: str, max_upload: int) -> None:
    """Only a first `feature_flags` message means anything; anything else is ignored."""
    try:
        message = loads(text)
    except RefusedJson:
        return
    if isinstance(message, dict) and message.get("type") == "feature_flags":
        flags = message.get("data")
        if not isinstance(flags, dict):
            flags = {}
        sock.supports_preview_metadata = bool(flags.get("supports_preview_metadata"))
        sock.send_json("feature_flags", server_features(max_upload))


def ws_routes() -> list[Route]:
    return [Route("GET", "/ws", websocket)]
