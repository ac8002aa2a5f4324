"""Requests between the gateways of one store: no user token, a signature by a live
gateway other than this one (comfyfleet.peers.signing). The internal routes
(`/comfyfleet/peer/...`) take nothing else, and answer 403 to anything else.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from comfyfleet.peers.signing import PeerKey, claimed_gateway, verify
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.store.base import GatewayLeases, StoreError

log = logging.getLogger(__name__)


def refusal(status: int, type_: str, message: str) -> web.Response:
    return web.json_response(prompt_error_body(error(type_, message)), status=status)


async def _signed_by_peer(
    request: web.Request, store: GatewayLeases, key: PeerKey, gateway_id: str
) -> bool:
    """Whether a live gateway other than this one signed the request, moments ago."""
    claimed = claimed_gateway(request.headers)
    if claimed is None or claimed == gateway_id:
        return False
    live = {gateway.id for gateway in await store.gateways()}
    if claimed not in live:
        return False
    return verify(await key.get(), request.headers, request.method, request.raw_path, time.time())


async def peer_refusal(
    request: web.Request, store: GatewayLeases, key: PeerKey, gateway_id: str
) -> web.Response | None:
    """None for a request a peer gateway signed; else the answer refusing it."""
    try:
        signed = await _signed_by_peer(request, store, key, gateway_id)
    except StoreError as exc:
        log.warning("a peer's request not checked: %s", exc)
        return refusal(503, "store_unavailable", "The store cannot be read now")
    if not signed:
        log.debug("%s refused: not signed by a peer gateway", request.path)
        return refusal(403, "forbidden", "Only the fleet's gateways may call this route")
    return None
