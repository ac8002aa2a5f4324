"""Asking the live peers for a file this gateway lacks, and keeping it here.

Peers are asked one after the other (a dead one fails at connect, within
CONNECT_TIMEOUT); what they send is untrusted: capped at the upload cap, read with
timeouts, stored under the name asked for (never one the peer gives), an asset blob only
when it has the hash its name promises. Requests for one file at once share one fetch.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders, UnsafePath, plain_name, plain_subfolder
from comfyfleet.peers.blobs import NotTheHash
from comfyfleet.peers.keep import TooLarge, keep
from comfyfleet.peers.signing import PEER_FILE_ROUTE, PeerKey, signed_headers
from comfyfleet.store.base import GatewayLeases, StoreError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0  # s to reach a peer: a gone one is passed over quickly
READ_TIMEOUT = 10.0  # s without a byte from a peer that answered
TOTAL_TIMEOUT = 300.0  # s for one file, whatever the peer does
#: What a peer URL in the store must look like to be asked.
PEER_URL = re.compile(r"^https?://[^/?#\s]+(/[^?#\s]*)?$")
_KINDS = ("input", "output", "temp")


@dataclass(frozen=True)
class FileRef:
    """A file of a tenant's input, output or temp folder, as `/view` names it."""

    tenant: str
    type: str
    subfolder: str
    filename: str

    def plain(self) -> bool:
        """Whether its names are plain (no separators in the name, no `..`): the only
        files asked of peers."""
        try:
            plain_name(self.filename)
            plain_subfolder(self.subfolder)
        except UnsafePath:
            return False
        return self.type in _KINDS

    def target(self) -> str:
        """The peer route's path and query for this file."""
        query = {
            "tenant": self.tenant,
            "type": self.type,
            "subfolder": self.subfolder,
            "filename": self.filename,
        }
        return f"{PEER_FILE_ROUTE}?{urlencode(query, quote_via=quote)}"


class PeerError(ComfyfleetError):
    """A peer answered, but not with the file."""


def annotated(value: str) -> tuple[str, str]:
    """A prompt's file value to (folder type, relative name): `sub/x.png [output]` ->
    (`output`, `sub/x.png`); input without a tag, as LoadImage reads it."""
    for kind in _KINDS:
        tag = f"[{kind}]"
        if value.endswith(tag):
            return kind, value.removesuffix(tag).removesuffix(" ")
    return "input", value


class PeerFiles:
    """Files this gateway lacks, fetched from the other live gateways of its store."""

    def __init__(self, store: GatewayLeases, gateway_id: str, key: PeerKey, limit: int) -> None:
        self.store = store
        self.gateway_id = gateway_id
        self.key = key
        self.limit = limit  # bytes: the upload cap
        self._session: aiohttp.ClientSession | None = None
        self._fetching: dict[tuple[FileRef, Folders], asyncio.Future[bool]] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def ensure(self, values: Sequence[str], folders: Folders, tenant: str) -> None:
        """Fetch the files prompt inputs name (`sub/x.png [input]`) that `folders` lacks,
        where a peer has them; the others are left for validation to report."""
        wanted = []
        for value in values:
            kind, relative = annotated(value)
            subfolder, name = posixpath.split(relative)
            ref = FileRef(tenant, kind, subfolder, name)
            if ref.plain():
                wanted.append(ref)
        if wanted:
            missing = await asyncio.to_thread(_missing, wanted, folders)
            for ref in missing:
                await self.fetch(ref, folders)

    async def fetch(self, ref: FileRef, folders: Folders) -> bool:
        """Ask the live peers for `ref` and keep it in `folders`; True when it is here now."""
        if not ref.plain():
            return False
        key = (ref, folders)
        running = self._fetching.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            found = await self._ask_peers(ref, folders)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        else:
            future.set_result(found)
        finally:
            del self._fetching[key]
        return found

    async def _ask_peers(self, ref: FileRef, folders: Folders) -> bool:
        try:
            peers = [
                g
                for g in await self.store.gateways()
                if g.id != self.gateway_id and PEER_URL.fullmatch(g.url)
            ]
            key = await self.key.get() if peers else b""
        except StoreError as exc:
            log.warning("cannot ask the peer gateways: %s", exc)
            return False
        for peer in peers:
            try:
                if await self._ask(peer, ref, folders, key):
                    return True
            except (
                aiohttp.ClientError,
                TimeoutError,
                PeerError,
                TooLarge,
                NotTheHash,
                UnsafePath,
                OSError,
            ) as exc:
                log.warning(
                    "gateway %s did not give %s file %r: %s",
                    peer.id,
                    ref.type,
                    posixpath.join(ref.subfolder, ref.filename),
                    exc or type(exc).__name__,
                    extra={"peer": peer.id},
                )
        return False

    async def _ask(self, peer: GatewayRecord, ref: FileRef, folders: Folders, key: bytes) -> bool:
        target = ref.target()
        headers = signed_headers(key, self.gateway_id, "GET", target, time.time())
        headers["Accept-Encoding"] = "identity"  # the file's own bytes, counted as sent
        url = URL(peer.url.rstrip("/") + target, encoded=True)
        timeout = aiohttp.ClientTimeout(
            total=TOTAL_TIMEOUT, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
        )
        session = self._client_session()
        async with session.get(url, headers=headers, timeout=timeout, allow_redirects=False) as got:
            if got.status == 404:
                return False
            if got.status != 200:
                raise PeerError(f"it answered {got.status}")
            if got.content_length is not None and got.content_length > self.limit:
                raise TooLarge(f"{got.content_length} bytes, over {self.limit}")
            chunks = got.content.iter_chunked(256 * 1024)
            return await keep(chunks, folders, ref.type, ref.subfolder, ref.filename, self.limit)

    def _client_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=64)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session


def _missing(refs: Sequence[FileRef], folders: Folders) -> list[FileRef]:
    """Those of `refs` that are not files in `folders` (those leading out are skipped)."""
    missing = []
    for ref in refs:
        try:
            path = folders.resolve_inside(ref.type, posixpath.join(ref.subfolder, ref.filename))
        except UnsafePath:
            continue
        if not path.is_file():
            missing.append(ref)
    return missing
