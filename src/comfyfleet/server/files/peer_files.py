"""`GET /comfyfleet/peer/file`: a file of this gateway's folders, for another gateway of
the same store (see comfyfleet.peers).

No user token: the request is signed with the fleet's key by a live gateway other than
this one (peers/signing.py); anything else is refused with 403. The file is looked up
as `/view` does, in the folders of the tenant named (the peer has checked that its
client is that tenant), and only here: a peer's request is never passed on.
"""

from __future__ import annotations

from aiohttp import web

from comfyfleet.peers.signing import PEER_FILE_ROUTE, PeerKey
from comfyfleet.server.access.peer_requests import peer_refusal, refusal
from comfyfleet.server.files.view_upload import local_file
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.store.base import GatewayLeases
from comfyfleet.tenants import DEFAULT_TENANT, TenantFolders, check_tenant_name


def peer_file_routes(
    store: GatewayLeases, key: PeerKey, gateway_id: str, tenants: TenantFolders
) -> list[Route]:
    async def peer_file(request: web.Request) -> web.StreamResponse:
        refused = await peer_refusal(request, store, key, gateway_id)
        if refused is not None:
            return refused
        query = request.rel_url.query
        try:
            tenant = check_tenant_name(query.get("tenant", DEFAULT_TENANT))
        except ValueError:
            return refusal(400, "invalid_tenant", "Not a tenant name")
        return await local_file(tenants.of(tenant), query)

    return [Route("GET", PEER_FILE_ROUTE, peer_file, api_alias=False, public=True)]
