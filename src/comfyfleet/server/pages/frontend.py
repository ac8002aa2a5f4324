"""The graph editor's files: ComfyUI's frontend, its workflow templates and node docs.

The editor comes from the `comfyui-frontend-package` wheel (1.58.1, installed with
comfyfleet) or from `--front-end-root DIR`; its files are never part of this repository.
Its template browser's templates come from `comfyui-workflow-templates` (0.1.95, as
ComfyUI 0.3.64 pins it, installed with comfyfleet), served at `/templates/` as ComfyUI
serves that package's folder: `index.json`, the per-language `index.<lang>.json`, each
template's workflow JSON and its thumbnails. Newer releases split that folder over
several packages (`comfyui-workflow-templates-json` for the indexes and workflows, media
bundles for the thumbnails); those that are installed are served first, one folder after
the other. The node docs (`comfyui-embedded-docs`)
are served at `/docs/` when installed. Without a package its paths are 404, except the
templates' indexes (`index.json`, `index_logo.json`), which are then empty: the editor
shows no templates (or no logos) instead of an error.

Every file is found with `resolve_inside`, so no link in a web root leads out of it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.resources
import logging
import mimetypes
import os
import pkgutil
from pathlib import Path

from aiohttp import web

from comfyfleet.folders import UnsafePath, resolve_inside
from comfyfleet.server.plumbing.routing import Route

log = logging.getLogger(__name__)

_INDEX_HEADERS = {
    "Content-Type": "text/html",
    "Cache-Control": "no-cache",
    "Pragma": "no-cache",
    "Expires": "0",
}
_IMAGES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: The template indexes the editor reads, and what a missing one answers: `index.json`
#: (the categories, any editor) and `index_logo.json` (the providers' logos, asked by
#: frontend 1.58 and later, shipped by newer comfyui-workflow-templates).
_EMPTY_INDEXES: dict[str, list[object] | dict[str, object]] = {
    "index.json": [],
    "index_logo.json": {},
}
_TYPES = {".js": "application/javascript", ".mjs": "application/javascript", ".webp": "image/webp"}


def package_dir(module: str, folder: str) -> Path | None:
    """`folder` inside an installed package (e.g. the frontend's `static`), None without it."""
    try:
        package = importlib.import_module(module)
    except ImportError:
        return None
    path = Path(str(importlib.resources.files(package) / folder))
    return path if path.is_dir() else None


#: The newer templates' packages: `comfyui_workflow_templates_json` first (indexes and
#: workflows), then every media bundle (`comfyui_workflow_templates_media_*`).
_SPLIT_TEMPLATES = "comfyui_workflow_templates_"
_SPLIT_INDEXES = "comfyui_workflow_templates_json"


def template_roots() -> list[Path]:
    """The `templates` folders to serve `/templates/` from, in the order they are asked:
    the split packages installed, then the single package's."""
    split = sorted(
        (m.name for m in pkgutil.iter_modules() if m.name.startswith(_SPLIT_TEMPLATES)),
        key=lambda name: (name != _SPLIT_INDEXES, name),
    )
    roots = [package_dir(name, "templates") for name in split]
    roots.append(package_dir("comfyui_workflow_templates", "templates"))
    return [root for root in roots if root is not None]


def web_root(configured: Path | None) -> Path | None:
    """The editor's files: `configured`, else the installed frontend package's."""
    if configured is not None:
        return configured.resolve()
    return package_dir("comfyui_frontend_package", "static")


def _headers(name: str) -> dict[str, str]:
    """Content type and caching as ComfyUI's: code and entry points are revalidated on
    every load (a new frontend takes effect at once), images kept for a day."""
    ext = os.path.splitext(name)[1].lower()
    headers = {"Content-Type": _TYPES.get(ext) or _guess(name)}
    base = name.rsplit("/", 1)[-1]
    if ext in (".js", ".mjs", ".css") or (base.startswith("index") and ext == ".json"):
        headers["Cache-Control"] = "no-cache"
    elif ext in _IMAGES:
        headers["Cache-Control"] = "public, max-age=86400"
    return headers


def _guess(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _find(root: Path, relative: str) -> Path | None:
    """The regular file `relative` names in `root`, or None."""
    if any(ord(c) < 0x20 for c in relative):
        return None
    try:
        path = resolve_inside(root, relative.lstrip("/"))
    except UnsafePath:
        return None
    return path if os.path.isfile(path) else None


def _find_first(roots: list[Path], relative: str) -> Path | None:
    return next((p for root in roots if (p := _find(root, relative)) is not None), None)


async def serve_file(root: Path | None, relative: str) -> web.StreamResponse:
    """A file under `root`, or an empty 404."""
    return await serve_first([] if root is None else [root], relative)


async def serve_first(roots: list[Path], relative: str) -> web.StreamResponse:
    """The file under the first of `roots` that has it, or an empty 404."""
    path = await asyncio.to_thread(_find_first, roots, relative)
    if path is None:
        return web.Response(status=404)
    return web.FileResponse(path, headers=_headers(path.name))


async def refuse_other_methods(request: web.Request) -> None:
    """405 (as without the catch-all) when another route has this path for other methods:
    `GET /prompt` is a wrong method, not a missing file."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not request.match_info.route.resource:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)


def frontend_routes(configured_root: Path | None) -> tuple[list[Route], Route]:
    """The editor's routes, and the catch-all for its files (to be installed last)."""
    root = web_root(configured_root)
    index_file = None if root is None else root / "index.html"
    if index_file is None or not index_file.is_file():
        index_file = None
        log.warning(
            "no graph editor to serve at /: install comfyui-frontend-package, or give "
            "--front-end-root a directory holding index.html"
        )
    templates = template_roots()
    docs = package_dir("comfyui_embedded_docs", "docs")

    async def index(request: web.Request) -> web.StreamResponse:
        if index_file is None:
            return web.Response(status=404)
        return web.FileResponse(index_file, headers=_INDEX_HEADERS)

    async def template_file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["path"]
        response = await serve_first(templates, name)
        if response.status == 404 and name in _EMPTY_INDEXES:
            # No package, or one older than the editor: an empty index, so the editor
            # shows fewer templates (or no provider logos) instead of an error.
            return web.json_response(_EMPTY_INDEXES[name])
        return response

    async def docs_file(request: web.Request) -> web.StreamResponse:
        return await serve_file(docs, request.match_info["path"])

    async def static_file(request: web.Request) -> web.StreamResponse:
        response = await serve_file(root, request.match_info["path"])
        if response.status == 404:
            await refuse_other_methods(request)
            return web.Response(status=404, content_type="application/octet-stream")
        return response

    routes = [
        Route("GET", "/", index, api_alias=False, page=True),
        Route("GET", "/templates/{path:.*}", template_file, api_alias=False),
        Route("GET", "/docs/{path:.*}", docs_file, api_alias=False),
    ]
    return routes, Route("GET", "/{path:.*}", static_file, api_alias=False)
