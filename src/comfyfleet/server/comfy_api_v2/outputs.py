"""The v2 asset routes: `GET /api/v2/assets/{id}` and `.../content` for a job's outputs
and uploaded assets alike, and the upload routes of assets.py.

Output ids are stateless (see shapes.py): the file is served from the caller's own
folders, with `/view`'s checks, once the job it names is found to be the caller's.
An uploaded asset's bytes are its blob in the tenant's input folder (fetched from the
gateway that took the upload when this one lacks it). `content` is
range-aware (206 for `Range: bytes=a-b`), as `/view` is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from comfyfleet.folders import Folders
from comfyfleet.server.access.auth import visible
from comfyfleet.server.comfy_api_v2 import assets, shapes
from comfyfleet.server.comfy_api_v2.errors import PREFIX, V2Error, not_found
from comfyfleet.server.comfy_api_v2.jobs import base_url, folders_of
from comfyfleet.server.files.view_upload import content_type_of, stored_file
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.plumbing.routing import Route

#: A file another gateway of the store holds, fetched into `folders` (see app.py).
FetchMissing = Callable[[web.Request, Folders, str, str, str], Awaitable[bool]]


def v2_asset_routes(fetch_missing: FetchMissing | None = None) -> list[Route]:
    async def located(request: web.Request) -> tuple[shapes.OutputRef, str, str]:
        ref = shapes.parse_output_id(request.match_info["asset_id"])
        if ref is None:
            raise not_found("asset")
        job = await request.app[GATEWAY].store.get(ref.prompt_id)
        if job is None or not visible(request, job.tenant):
            raise not_found("asset")
        folders = folders_of(request)

        async def fetch(kind: str, subfolder: str, name: str) -> bool:
            return fetch_missing is not None and await fetch_missing(
                request, folders, kind, subfolder, name
            )

        found = await stored_file(folders, ref.query(), fetch)
        if isinstance(found, int):
            if found == 400:
                raise V2Error(400, "invalid_request", "The asset names an unusable file")
            raise not_found("asset")
        return ref, found[0], found[1]

    async def content(request: web.Request) -> web.StreamResponse:
        record = await assets.uploaded(request, request.match_info["asset_id"])
        if record is not None:
            path = await assets.local_blob(request, record)
            if path is None:
                raise not_found("asset")
            return web.FileResponse(
                path, headers=_file_headers(record.file_path, record.content_type)
            )
        _ref, found, name = await located(request)
        return web.FileResponse(found, headers=_file_headers(name, content_type_of(name)))

    async def asset(request: web.Request) -> web.Response:
        record = await assets.uploaded(request, request.match_info["asset_id"])
        if record is not None:
            return web.json_response(assets.asset_body(request, record))
        ref, path, name = await located(request)
        gw = request.app[GATEWAY]
        job = await gw.store.get(ref.prompt_id)
        if job is None:
            raise not_found("asset")
        try:
            size = (await _stat(path)).st_size
        except OSError:
            raise not_found("asset") from None
        deadline = shapes.expires_at(job, gw.config.history_max_age).isoformat()
        asset_id = request.match_info["asset_id"]
        return web.json_response(
            {
                "id": asset_id,
                "hash": None,
                "size_bytes": size,
                "content_type": shapes.media_type(name),
                "file_path": name,
                "created_at": shapes.iso(job.finished_at or job.created_at),
                "url": f"{base_url(request)}{PREFIX}/assets/{asset_id}/content",
                "url_expires_at": deadline,
                "expires_at": deadline,
                "job_id": job.prompt_id,
            }
        )

    return [
        Route("POST", f"{PREFIX}/assets", assets.upload),
        Route("POST", f"{PREFIX}/assets/from-hash", assets.from_hash),
        Route("HEAD", f"{PREFIX}/assets/by-hash/{{hash}}", assets.by_hash),
        Route("GET", f"{PREFIX}/assets/{{asset_id}}", asset),
        Route("DELETE", f"{PREFIX}/assets/{{asset_id}}", assets.delete),
        Route("GET", f"{PREFIX}/assets/{{asset_id}}/content", content),
    ]


def _file_headers(name: str, content_type: str) -> dict[str, str]:
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return {"Content-Type": content_type, "Content-Disposition": f'inline; filename="{quoted}"'}


async def _stat(path: str) -> os.stat_result:
    return await asyncio.to_thread(os.stat, path)
