"""Asking the gateway that runs a job to cancel or interrupt it: a gateway runs only its
own attempts, so a cancel received elsewhere is passed to the job's owner (the gateway
whose lease covers its running attempt, as the store says).

The request is signed as file requests are (signing.py), names the job and its tenant in
the signed query, and is bounded: a peer that is gone or hung fails within
TOTAL_TIMEOUT, and the job then ends as its lease says (taken over once it runs out).
Owners that accepted a cancel are remembered a while, so this gateway shows the job as
`canceling` until it stops, as the owner does.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from comfyfleet.peers.fetch import PEER_URL
from comfyfleet.peers.signing import PEER_CANCEL_ROUTE, PeerKey, signed_headers
from comfyfleet.store.base import GatewayLeases, StoreError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 1.0  # s to reach the owner
TOTAL_TIMEOUT = 3.0  # s for its answer, whatever it does
MAX_ANSWER = 64 * 1024  # bytes of an answer read (it lists at most one id)
#: What a peer may be asked to do to a job it runs.
HOW = ("cancel", "interrupt")
#: s a cancel the owner accepted shows the job as `canceling` here (while it runs), and
#: how many such jobs are remembered.
REMEMBERED_FOR = 300.0
REMEMBERED = 10_000


class PeerCancels:
    """Cancels and interrupts of jobs other gateways of the store run."""

    def __init__(self, store: GatewayLeases, gateway_id: str, key: PeerKey) -> None:
        self.store = store
        self.gateway_id = gateway_id
        self.key = key
        self._session: aiohttp.ClientSession | None = None
        self._accepted: OrderedDict[str, float] = OrderedDict()  # prompt id -> when

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def cancelling(self, prompt_id: str) -> bool:
        """Whether another gateway accepted a cancel of this job from here, lately."""
        at = self._accepted.get(prompt_id)
        return at is not None and time.monotonic() - at < REMEMBERED_FOR

    async def ask(self, owner: str, tenant: str, prompt_id: str, how: str) -> bool:
        """Ask gateway `owner` to `how` (cancel or interrupt) the job; True when it did."""
        try:
            peer = next((g for g in await self.store.gateways() if g.id == owner), None)
            if peer is None or owner == self.gateway_id or not PEER_URL.fullmatch(peer.url):
                return False  # gone: its lease decides what becomes of the job
            key = await self.key.get()
        except StoreError as exc:
            log.warning("cannot ask gateway %s to %s a job: %s", owner, how, exc)
            return False
        query = urlencode({"tenant": tenant, "prompt_id": prompt_id, "how": how}, quote_via=quote)
        target = f"{PEER_CANCEL_ROUTE}?{query}"
        headers = signed_headers(key, self.gateway_id, "POST", target, time.time())
        url = URL(peer.url.rstrip("/") + target, encoded=True)
        timeout = aiohttp.ClientTimeout(total=TOTAL_TIMEOUT, sock_connect=CONNECT_TIMEOUT)
        try:
            async with self._client_session().post(
                url, headers=headers, timeout=timeout, allow_redirects=False
            ) as got:
                if got.status != 200:
                    raise ValueError(f"it answered {got.status}")
                raw = bytearray()
                async for chunk in got.content.iter_chunked(4096):
                    raw += chunk
                    if len(raw) > MAX_ANSWER:
                        raise ValueError("its answer is too long")
            answer = json.loads(raw)
            listed = answer.get("cancelled") if isinstance(answer, dict) else None
            done = isinstance(listed, list) and prompt_id in listed
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "gateway %s did not %s job %s: %s",
                owner,
                how,
                prompt_id,
                exc or type(exc).__name__,
                extra={"peer": owner, "prompt_id": prompt_id},
            )
            return False
        if done and how == "cancel":
            self._remember(prompt_id)
        return done

    def _remember(self, prompt_id: str) -> None:
        self._accepted[prompt_id] = time.monotonic()
        self._accepted.move_to_end(prompt_id)
        while len(self._accepted) > REMEMBERED:
            self._accepted.popitem(last=False)

    def _client_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16))
        return self._session
