"""How gateways sharing one store sign their requests to each other.

A request carries the sending gateway's id, the time and an HMAC-SHA256 over method,
path with query, gateway id and time, keyed by a secret the gateways share through the
store (made by the first gateway that needs it). A receiver accepts it from a live
gateway other than itself, within VALIDITY seconds of its own clock. The key stays in
memory and in the store: never in a header, a log line or a file of the data dir.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Mapping

from comfyfleet.domain.gateways import GATEWAY_ID
from comfyfleet.store.base import GatewayLeases

#: The internal route a gateway serves its files to its peers on (not in docs/openapi.json).
PEER_FILE_ROUTE = "/comfyfleet/peer/file"
#: The internal route a gateway takes cancels of the jobs it runs on (not in the docs either).
PEER_CANCEL_ROUTE = "/comfyfleet/peer/cancel"
#: Every route between gateways: no client's, left out of docs/openapi.json.
PEER_ROUTES = (PEER_FILE_ROUTE, PEER_CANCEL_ROUTE)
GATEWAY_HEADER = "X-Comfyfleet-Gateway"
TIME_HEADER = "X-Comfyfleet-Time"
SIGNATURE_HEADER = "X-Comfyfleet-Signature"
#: How far a request's time may be from the receiver's clock (s): a signed request can be
#: replayed only that long, and it only reads a file or stops a job again.
VALIDITY = 30.0
#: The store's name for the key, and its size.
KEY_NAME = "peer-requests"
KEY_BYTES = 32


def _mac(key: bytes, method: str, target: str, gateway: str, stamp: str) -> str:
    message = "\n".join((method.upper(), target, gateway, stamp)).encode("utf-8", "replace")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signed_headers(
    key: bytes, gateway: str, method: str, target: str, now: float
) -> dict[str, str]:
    """The headers signing a request for `target` (its path and raw query) by `gateway`."""
    stamp = str(int(now))
    return {
        GATEWAY_HEADER: gateway,
        TIME_HEADER: stamp,
        SIGNATURE_HEADER: _mac(key, method, target, gateway, stamp),
    }


def claimed_gateway(headers: Mapping[str, str]) -> str | None:
    """The gateway a request says it comes from, if it names one the way ids are made."""
    gateway = headers.get(GATEWAY_HEADER, "")
    return gateway if GATEWAY_ID.fullmatch(gateway) else None


def verify(key: bytes, headers: Mapping[str, str], method: str, target: str, now: float) -> bool:
    """Whether the request's signature is good and fresh."""
    gateway = claimed_gateway(headers)
    stamp = headers.get(TIME_HEADER, "")
    signature = headers.get(SIGNATURE_HEADER, "")
    if gateway is None or not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        return False
    if abs(now - int(stamp)) > VALIDITY:
        return False
    expected = _mac(key, method, target, gateway, stamp)
    return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))


class PeerKey:
    """The shared key, read from the store (or made there) the first time it is needed,
    so a gateway alone never makes one."""

    def __init__(self, store: GatewayLeases) -> None:
        self._store = store
        self._key: bytes | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"PeerKey(loaded={self._key is not None})"

    async def get(self) -> bytes:
        async with self._lock:
            if self._key is None:
                candidate = secrets.token_bytes(KEY_BYTES)
                self._key = await self._store.fleet_key(KEY_NAME, candidate)
            return self._key
