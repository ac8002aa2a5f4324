"""The gateway's side of "Run on the Fleet": child prompts queued in-process, as their
parent's tenant, through the same checks as `POST /prompt` (validation, routing, caps,
budgets), each keyed so that a parent run again never queues a child twice."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from comfyfleet.children.graph import PARENT_KEY
from comfyfleet.children.jobs import TILES_ROUTE, ChildFailed, ChildRequest
from comfyfleet.children.tiles import TILE_FILE
from comfyfleet.domain.idempotency import IdempotencyKeyTaken
from comfyfleet.folders import Folders, plain_name
from comfyfleet.peers.fetch import FileRef
from comfyfleet.server.access.auth import tenant_name
from comfyfleet.server.comfyui_api.idempotency import canonical_digest
from comfyfleet.server.comfyui_api.prompts import bad_request, submit_as
from comfyfleet.server.comfyui_api.waits import PromptWaits
from comfyfleet.server.files.view_upload import stored_file
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.jobs_api.cancels import cancel_anywhere
from comfyfleet.server.plumbing.routing import Route
from comfyfleet.tenants import DEFAULT_TENANT

#: How long one wait for a child's end lasts before it asks the store again.
WAIT_ROUND = 300.0
#: A child's file (an image, a latent, a video) is read whole: past this it is refused.
MAX_FILE_BYTES = 256 * 1024 * 1024


class GatewayChildren:
    """`ChildJobs` on this gateway's queue (children.jobs)."""

    def __init__(self, gw: Gateway, waits: PromptWaits) -> None:
        self._gw = gw
        self._waits = waits

    async def queue(self, child: ChildRequest) -> str:
        parent = await self._gw.store.get(child.parent)
        tenant = parent.tenant if parent is not None else DEFAULT_TENANT
        named = {"prompt_id": child.parent, "node_id": child.node_id, "index": child.index}
        body = {"prompt": child.prompt}
        keyed = (child.key, canonical_digest({**body, PARENT_KEY: named}))
        first = await self._gw.store.idempotent_request(tenant, child.key)
        if first is None:
            try:
                answer = await submit_as(tenant, self._gw, body, keyed, parent=named)
            except IdempotencyKeyTaken as taken:  # queued meanwhile (another gateway)
                first = taken.first
            else:
                if isinstance(answer, web.Response):
                    raise ChildFailed(f"child {child.index + 1} refused: {_refusal(answer)}")
                return str(answer["prompt_id"])
        if first.request_hash != keyed[1]:
            raise ChildFailed(f"child {child.index + 1}: its key was used for another prompt")
        return str(first.answer["prompt_id"])

    async def outcome(self, prompt_id: str) -> dict[str, Any]:
        while True:
            answer = await self._waits.wait(prompt_id, WAIT_ROUND, lambda: True)
            if answer is None:
                if await self._gw.store.get(prompt_id) is None:
                    raise ChildFailed(f"child {prompt_id} is gone")
                continue  # still running, or the wait round ran out
            entry = answer.get(prompt_id)
            if entry is None:
                raise ChildFailed(f"child {prompt_id} was cancelled before it ran")
            status = entry.get("status") or {}
            if status.get("status_str") != "success":
                raise ChildFailed(f"child {prompt_id} failed: {_error_of(status)}")
            return dict(entry)

    async def file(self, prompt_id: str, ref: dict[str, Any]) -> bytes:
        job = await self._gw.store.get(prompt_id)
        tenant = job.tenant if job is not None else DEFAULT_TENANT
        folders = self._gw.tenants.of(tenant)
        query = {k: str(ref.get(k) or "") for k in ("filename", "subfolder", "type")}

        async def from_peer(kind: str, subfolder: str, name: str) -> bool:
            return await self._gw.peers.fetch(FileRef(tenant, kind, subfolder, name), folders)

        found = await stored_file(folders, query, from_peer)
        if isinstance(found, int):
            raise ChildFailed(f"child {prompt_id}: its file {query['filename']!r} ({found})")
        return await asyncio.to_thread(_read_whole, found[0])

    async def put_input(self, parent: str, name: str, data: bytes) -> str:
        folders = await self._folders_of(parent)
        path = folders.resolve_inside("input", plain_name(name))
        await asyncio.to_thread(_write_whole, path, data)
        return path.name

    async def drop_inputs(self, parent: str, names: list[str]) -> None:
        folders = await self._folders_of(parent)
        paths = [folders.resolve_inside("input", plain_name(name)) for name in names]
        await asyncio.to_thread(_remove, paths)

    async def _folders_of(self, prompt_id: str) -> Folders:
        job = await self._gw.store.get(prompt_id)
        return await self._gw.tenants.ready(job.tenant if job is not None else DEFAULT_TENANT)

    async def cancel(self, prompt_ids: list[str]) -> None:
        await cancel_anywhere(self._gw, prompt_ids)


async def drop_tile(request: web.Request) -> web.Response:
    """`DELETE /comfyfleet/tiles/{name}`: a tile that Tiles on the Fleet inside a ComfyUI
    put in the caller's input folder, removed once its children ended. Only a tile's
    name is taken: no other input file can be removed this way."""
    name = request.match_info["name"]
    if not TILE_FILE.fullmatch(name):
        return bad_request("invalid_tile", "Not the name of a fleet tile", name[:100])
    folders = await request.app[GATEWAY].tenants.ready(tenant_name(request))
    await asyncio.to_thread(_remove, [folders.resolve_inside("input", name)])
    return web.Response(status=204)


def children_routes() -> list[Route]:
    return [Route("DELETE", TILES_ROUTE + "/{name}", drop_tile, api_alias=False)]


def _write_whole(path: Path, data: bytes) -> None:
    """Write `data` at `path` under a temporary name first: a reader never sees half."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _read_whole(path: str) -> bytes:
    with open(path, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ChildFailed(f"a child's file is over {MAX_FILE_BYTES} bytes")
    return data


def _refusal(response: web.Response) -> str:
    """The message of an error response of `submit_as`."""
    try:
        body = json.loads(response.body or b"{}")  # type: ignore[arg-type]
        err = body.get("error") or {}
        return f"{err.get('message')}: {err.get('details')}".rstrip(": ")
    except (ValueError, AttributeError):
        return f"HTTP {response.status}"


def _error_of(status: dict[str, Any]) -> str:
    for kind, data in reversed(status.get("messages") or []):
        if kind in ("execution_error", "execution_interrupted") and isinstance(data, dict):
            text = data.get("exception_message") or kind
            return f"{data.get('exception_type') or kind}: {text}".strip()
    return str(status.get("status_str") or "no status")
