"""`/extensions`: the editor's JS extensions, from here and from the fleet's backends.

As in ComfyUI, the list holds the web root's own (`/extensions/core/...`) and every
node pack's web folder (`/extensions/<pack>/...`): comfyfleet's own pack, the packs
loaded with --custom-nodes, and the packs of each connected ComfyUI backend. A backend's
files are fetched from it when the editor asks for them (the gateway is the only origin
the browser talks to), so custom node packs' widgets load in the editor. A backend's
extensions run in the editor with the user's rights: they are only as trustworthy as the
backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib import parse

from aiohttp import web

from comfyfleet.folders import UnsafePath, plain_name
from comfyfleet.lanes.backend import BackendError
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.server.pages.frontend import serve_file
from comfyfleet.server.plumbing.routing import Route

log = logging.getLogger(__name__)

#: comfyfleet's own web extension (a link to the fleet dashboard).
OWN_WEB_DIR = Path(__file__).parent / "web" / "extension"
OWN_PACK = "comfyfleet"
#: Seconds a backend's list of extensions is kept before it is asked again.
LIST_TTL = 30.0
#: Seconds a backend has to answer for its list or a file.
FETCH_TIMEOUT = 10.0
#: Bytes of one proxied file (a pack's bundled JS is rarely past a few MiB).
MAX_FILE_BYTES = 16 * 1024 * 1024
#: Entries taken from one backend's list.
MAX_ENTRIES = 5000
_PASSED_TYPES = {
    ".js": "application/javascript",
    ".mjs": "application/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".webp": "image/webp",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".woff2": "font/woff2",
    ".woff": "font/woff",
    ".ttf": "font/ttf",
    ".wasm": "application/wasm",
}


def js_files(directory: Path) -> list[str]:
    """The `.js` files under `directory`, relative to it with `/`, sorted."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".js"):
                out.append(os.path.relpath(os.path.join(dirpath, name), directory))
    return [p.replace(os.sep, "/") for p in out]


def split_entry(entry: object) -> tuple[str, str] | None:
    """`/extensions/<pack>/<path>` -> (pack, path) decoded, each part a plain name."""
    if not isinstance(entry, str) or not entry.startswith("/extensions/"):
        return None
    parts = [parse.unquote(p) for p in entry.removeprefix("/extensions/").split("/")]
    try:
        for part in parts:
            plain_name(part)
    except UnsafePath:
        return None
    if len(parts) < 2 or any(ord(c) < 0x20 for part in parts for c in part):
        return None
    return parts[0], "/".join(parts[1:])


def entry_url(pack: str, path: str) -> str:
    return f"/extensions/{parse.quote(pack)}/" + "/".join(parse.quote(p) for p in path.split("/"))


@dataclass
class _Listed:
    at: float
    packs: dict[str, list[str]] = field(default_factory=dict)  # pack -> its JS files


class Extensions:
    """Where each pack's web files are: a local folder, or a backend."""

    def __init__(
        self,
        web_root: Path | None,
        local_dirs: dict[str, Path],
        backends: dict[str, ComfyUILane],
        *,
        ttl: float = LIST_TTL,
    ) -> None:
        self.web_root = web_root
        self.local = {OWN_PACK: OWN_WEB_DIR, **local_dirs}
        self.backends = backends  # the fleet's, by name (it changes at run time)
        self.ttl = ttl
        self._listed: dict[str, _Listed] = {}

    # -- the list ------------------------------------------------------------------

    def local_listing(self) -> list[str]:
        core = (
            [f"/extensions/{p}" for p in js_files(self.web_root / "extensions")]
            if self.web_root is not None
            else []
        )
        packs = [entry_url(pack, p) for pack, d in self.local.items() for p in js_files(d)]
        return core + packs

    async def listing(self) -> list[str]:
        local = await asyncio.to_thread(self.local_listing)
        remote = await self.remote_packs()
        seen = set(local)
        out = list(local)
        for pack, paths in remote.items():
            for path in paths:
                url = entry_url(pack, path)
                if url not in seen:
                    seen.add(url)
                    out.append(url)
        return out

    async def remote_packs(self) -> dict[str, list[str]]:
        """Each backend pack's JS files: the first connected backend with a pack wins."""
        lanes = [lane for lane in self.backends.values() if lane.connected]
        await asyncio.gather(*(self._refresh(lane) for lane in lanes))
        packs: dict[str, list[str]] = {}
        for lane in lanes:
            listed = self._listed.get(lane.spec.name)
            for pack, paths in (listed.packs if listed else {}).items():
                if pack not in self.local and pack != "core":
                    packs.setdefault(pack, paths)
        return packs

    async def _refresh(self, lane: ComfyUILane) -> None:
        name = lane.spec.name
        listed = self._listed.get(name)
        if listed is not None and time.monotonic() - listed.at < self.ttl:
            return
        fresh = _Listed(time.monotonic())
        try:
            entries = await lane.fetch_json("/extensions", timeout=FETCH_TIMEOUT)
        except Exception as exc:  # a backend's failure leaves out its packs, nothing else
            log.info("no extensions from backend %s: %s", name, exc)
            entries = []
        for entry in entries[:MAX_ENTRIES] if isinstance(entries, list) else []:
            split = split_entry(entry)
            if split is not None:
                fresh.packs.setdefault(split[0], []).append(split[1])
        self._listed[name] = fresh

    def _backend_of(self, pack: str) -> ComfyUILane | None:
        for lane in self.backends.values():
            listed = self._listed.get(lane.spec.name)
            if listed is not None and pack in listed.packs and lane.connected:
                return lane
        return None

    # -- one file --------------------------------------------------------------------

    async def file(self, pack: str, path: str) -> web.StreamResponse:
        if pack in self.local:
            return await serve_file(self.local[pack], path)
        if pack != "core":
            lane = self._backend_of(pack)
            if lane is None:
                await self.remote_packs()  # a pack the editor knows of from an older list
                lane = self._backend_of(pack)
            if lane is not None:
                return await self._proxy(lane, pack, path)
        return await serve_file(self.web_root, f"extensions/{pack}/{path}")

    async def _proxy(self, lane: ComfyUILane, pack: str, path: str) -> web.StreamResponse:
        parts = path.split("/")
        try:
            for part in parts:
                plain_name(part)
        except UnsafePath:
            return web.Response(status=404)
        try:
            answer = await lane.read_file(
                entry_url(pack, path), max_bytes=MAX_FILE_BYTES, timeout=FETCH_TIMEOUT
            )
        except BackendError as exc:  # unreachable, or a file past the cap
            log.info("extension %s/%s from backend %s: %s", pack, path, lane.spec.name, exc)
            return web.Response(status=502)
        if answer.status != 200:
            return web.Response(status=404 if answer.status == 404 else 502)
        body = answer.body
        kind = _PASSED_TYPES.get(os.path.splitext(path)[1].lower(), "application/octet-stream")
        return web.Response(body=body, headers={"Content-Type": kind, "Cache-Control": "no-cache"})


def extension_routes(extensions: Extensions) -> list[Route]:
    async def listing(request: web.Request) -> web.StreamResponse:
        return web.json_response(await extensions.listing())

    async def file(request: web.Request) -> web.StreamResponse:
        return await extensions.file(request.match_info["pack"], request.match_info["path"])

    return [
        Route("GET", "/extensions", listing),
        Route("GET", "/extensions/{pack}/{path:.*}", file, api_alias=False),
    ]
