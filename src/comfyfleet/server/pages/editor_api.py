"""The rest of what the graph editor calls: model folders and files, node translations,
custom nodes' workflow templates, and ComfyUI's `/internal` routes (logs, folders, files).

Shapes follow ComfyUI 0.3.64 (`app/model_manager.py`, `app/custom_node_manager.py`,
`api_server/routes/internal`). `/internal` routes have no `/api` alias, as in ComfyUI.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from PIL import Image

from comfyfleet.folders import Folders, UnsafePath, resolve_inside
from comfyfleet.server.comfyui_api.system import MODEL_FOLDERS
from comfyfleet.server.pages.logbuffer import LogBuffer
from comfyfleet.server.plumbing.client_json import read_json
from comfyfleet.server.plumbing.routing import Route, empty_ok

_PT = MODEL_FOLDERS["checkpoints"][1]  # ComfyUI's supported_pt_extensions
_NOT_IN_LIBRARY = ("configs", "custom_nodes")
#: Bytes of a safetensors header `/view_metadata` reads at most (ComfyUI's bound).
MAX_HEADER = 1024 * 1024
_PREVIEW_TYPES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


def model_dirs(models_root: Path, folder: str) -> list[Path]:
    """The directories a model folder is read from, in ComfyUI's order."""
    return [models_root / directory for directory in MODEL_FOLDERS[folder][0]]


def model_files(models_root: Path, folder: str) -> list[dict[str, Any]]:
    """`/experiment/models/{folder}`: every model file with its folder index and times."""
    out: list[dict[str, Any]] = []
    for index, directory in enumerate(model_dirs(models_root, folder)):
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != ".git")
            for name in sorted(filenames):
                if name.startswith(".") or os.path.splitext(name)[1].lower() not in _PT:
                    continue
                path = os.path.join(dirpath, name)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                out.append(
                    {
                        "name": os.path.relpath(path, directory),
                        "pathIndex": index,
                        "modified": info.st_mtime,
                        "created": info.st_ctime,
                        "size": info.st_size,
                    }
                )
    return out


def safetensors_metadata(path: Path) -> dict[str, Any] | None:
    """The `__metadata__` of a safetensors file's header; None without one."""
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > MAX_HEADER:
                return None
            header = json.loads(file.read(length))
    except (OSError, struct.error, ValueError):
        return None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else None


def _find_model(models_root: Path, folder: str, name: str) -> Path | None:
    """The file `name` in the first of the folder's directories that has it."""
    for directory in model_dirs(models_root, folder):
        try:
            path = resolve_inside(directory, name)
        except UnsafePath:
            return None
        if os.path.isfile(path):
            return path
    return None


def _view_metadata(models_root: Path, folder: str, name: str) -> web.Response:
    if folder not in MODEL_FOLDERS or not name.endswith(".safetensors") or "\x00" in name:
        return web.Response(status=404)
    path = _find_model(models_root, folder, name)
    metadata = None if path is None else safetensors_metadata(path)
    return web.Response(status=404) if metadata is None else web.json_response(metadata)


def _preview(models_root: Path, folder: str, index: str, name: str) -> web.Response:
    """A model's preview picture (`x.png` or `x.preview.png` beside `x.safetensors`) as
    WEBP; 404 when it has none."""
    directories = model_dirs(models_root, folder) if folder in MODEL_FOLDERS else []
    if not index.isdigit() or int(index) >= len(directories) or "\x00" in name:
        return web.Response(status=404)
    stem = os.path.splitext(name)[0]
    for suffix in ("", ".preview"):
        for ext in _PREVIEW_TYPES:
            picture = _webp(directories[int(index)], stem + suffix + ext)
            if picture is not None:
                return web.Response(body=picture, content_type="image/webp")
    return web.Response(status=404)


def _webp(directory: Path, name: str) -> bytes | None:
    try:
        path = resolve_inside(directory, name)
        with Image.open(path) as image:
            out = io.BytesIO()
            image.save(out, format="WEBP")
            return out.getvalue()
    except (UnsafePath, OSError, ValueError, Image.DecompressionBombError):
        return None


def _newest_first(folder: Path) -> list[str]:
    try:
        entries = [e for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return []
    entries.sort(key=lambda e: -e.stat().st_mtime)
    return [e.name for e in entries]


def editor_routes(
    models_root: Path,
    folders_for: Callable[[web.Request], Folders],
    logs: LogBuffer,
    subscribe: Callable[[web.Request, str, bool], None],
) -> list[Route]:
    """`subscribe(request, client_id, enabled)` starts or stops `logs` frames to a client."""

    async def model_folders(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            [
                {"name": name, "folders": [str(d) for d in model_dirs(models_root, name)]}
                for name in MODEL_FOLDERS
                if name not in _NOT_IN_LIBRARY
            ]
        )

    async def models_in(request: web.Request) -> web.StreamResponse:
        folder = request.match_info["folder"]
        if folder not in MODEL_FOLDERS:
            return web.Response(status=404)
        return web.json_response(await asyncio.to_thread(model_files, models_root, folder))

    async def model_preview(request: web.Request) -> web.StreamResponse:
        info = request.match_info
        args = (models_root, info["folder"], info["path_index"], info["filename"])
        return await asyncio.to_thread(_preview, *args)

    async def view_metadata(request: web.Request) -> web.StreamResponse:
        name = request.query.get("filename")
        if name is None:
            return web.Response(status=404)
        folder = request.match_info["folder_name"]
        return await asyncio.to_thread(_view_metadata, models_root, folder, name)

    async def i18n(request: web.Request) -> web.StreamResponse:
        return web.json_response({})  # no node pack here ships translations

    async def workflow_templates(request: web.Request) -> web.StreamResponse:
        return web.json_response({})  # no node pack here ships example workflows

    async def global_subgraphs(request: web.Request) -> web.StreamResponse:
        # ComfyUI lists the subgraph blueprints its custom node packs ship (their
        # `subgraphs/*.json`), keyed by id; no pack here ships any.
        return web.json_response({})

    async def global_subgraph(request: web.Request) -> web.StreamResponse:
        return web.json_response(None)  # an unknown id: ComfyUI answers null, not a 404

    async def folder_paths(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {name: [str(d) for d in model_dirs(models_root, name)] for name in MODEL_FOLDERS}
        )

    async def files(request: web.Request) -> web.StreamResponse:
        folder = folders_for(request).of_type(request.match_info["directory_type"])
        if folder is None:
            return web.json_response({"error": "Invalid directory type"}, status=400)
        return web.json_response(await asyncio.to_thread(_newest_first, folder))

    async def get_logs(request: web.Request) -> web.StreamResponse:
        return web.json_response("".join(f"{e['t']} - {e['m']}" for e in logs.entries()))

    async def raw_logs(request: web.Request) -> web.StreamResponse:
        return web.json_response({"entries": logs.entries(), "size": terminal_size()})

    async def subscribe_logs(request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        body = body if isinstance(body, dict) else {}
        client_id, enabled = body.get("clientId"), body.get("enabled")
        if not isinstance(client_id, str) or not client_id or not isinstance(enabled, bool):
            return web.json_response({"error": "clientId and enabled are required"}, status=400)
        subscribe(request, client_id, enabled)
        return empty_ok()

    return [
        Route("GET", "/experiment/models", model_folders),
        Route("GET", "/experiment/models/{folder}", models_in),
        Route(
            "GET", "/experiment/models/preview/{folder}/{path_index}/{filename:.*}", model_preview
        ),
        Route("GET", "/view_metadata/{folder_name}", view_metadata),
        Route("GET", "/i18n", i18n),
        Route("GET", "/workflow_templates", workflow_templates),
        Route("GET", "/global_subgraphs", global_subgraphs),
        Route("GET", "/global_subgraphs/{id}", global_subgraph),
        Route("GET", "/internal/folder_paths", folder_paths, api_alias=False),
        Route("GET", "/internal/files/{directory_type}", files, api_alias=False),
        Route("GET", "/internal/logs", get_logs, api_alias=False, admin=True),
        Route("GET", "/internal/logs/raw", raw_logs, api_alias=False, admin=True),
        Route("PATCH", "/internal/logs/subscribe", subscribe_logs, api_alias=False, admin=True),
    ]


def terminal_size() -> dict[str, int]:
    size = shutil.get_terminal_size()
    return {"cols": size.columns, "rows": size.lines}
