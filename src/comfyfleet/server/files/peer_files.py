"""`GET /comfyfleet/peer/file`: a file of this gateway's folders, for another gateway of
the same store (see comfyfleet.peers).

No user token: the request is signed with the fleet's key by a live gateway other than
this one (peers/signing.py); anything else is refused with 403. The file is looked up
as `/view` does, in the folders of the tenant named (the peer has checked that its
client is that tenant), and only here: a peer's request is never passed on.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from comfyfleet.peers.signing import PEER_FILE_ROUTE, PeerKey, claimed_gateway, verify
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.files.view_upload import local_file
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.store.base import GatewayLeases, StoreError
from comfyfleet.tenants import DEFAULT_TENANT, TenantFolders, check_tenant_name

log = logging.getLogger(__name__)


def _refusal(status: int, type_: str, message: str) -> web.Response:
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


def peer_file_routes(
    store: GatewayLeases, key: PeerKey, gateway_id: str, tenants: TenantFolders
) -> list[Route]:
    async def peer_file(request: web.Request) -> web.StreamResponse:
        try:
            signed = await _signed_by_peer(request, store, key, gateway_id)
        except StoreError as exc:
            log.warning("a peer's file request not checked: %s", exc)
            return _refusal(503, "store_unavailable", "The store cannot be read now")
        if not signed:
            log.debug("%s refused: not signed by a peer gateway", PEER_FILE_ROUTE)
            return _refusal(403, "forbidden", "Only the fleet's gateways may call this route")
        query = request.rel_url.query
        try:
            tenant = check_tenant_name(query.get("tenant", DEFAULT_TENANT))
        except ValueError:
            return _refusal(400, "invalid_tenant", "Not a tenant name")
        return await local_file(tenants.of(tenant), query)

    return [Route("GET", PEER_FILE_ROUTE, peer_file, api_alias=False, public=True)]
