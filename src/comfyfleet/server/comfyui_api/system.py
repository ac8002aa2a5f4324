"""Server and node information: `/object_info`, `/system_stats`, `/features`, `/models`, ...

Shapes follow ComfyUI 0.3.64, which is also the version reported to clients: the
frontend and API clients gate features on `comfyui_version`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.folders import Folders
from comfyfleet.server.plumbing.client_json import read_json
from comfyfleet.server.plumbing.routing import Route, empty_ok

log = logging.getLogger(__name__)

COMFYUI_VERSION = "0.3.64"
# What ComfyUI 0.3.64 pins; the frontend compares these with its own versions.
_PINNED_VERSIONS = {
    "required_frontend_version": "1.27.10",
    "installed_templates_version": "0.1.95",
    "required_templates_version": "0.1.95",
}

_PT = frozenset({".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"})
# ComfyUI's model folder names, in its order. Each maps to the directories read under the
# models root (legacy names after the current one) and the extensions listed (empty: any).
# `custom_nodes` lives outside the models root in ComfyUI, so it lists nothing here.
MODEL_FOLDERS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "checkpoints": (("checkpoints",), _PT),
    "configs": (("configs",), frozenset({".yaml"})),
    "loras": (("loras",), _PT),
    "vae": (("vae",), _PT),
    "text_encoders": (("text_encoders", "clip"), _PT),
    "diffusion_models": (("unet", "diffusion_models"), _PT),
    "clip_vision": (("clip_vision",), _PT),
    "style_models": (("style_models",), _PT),
    "embeddings": (("embeddings",), _PT),
    "diffusers": (("diffusers",), frozenset({"folder"})),
    "vae_approx": (("vae_approx",), _PT),
    "controlnet": (("controlnet", "t2i_adapter"), _PT),
    "gligen": (("gligen",), _PT),
    "upscale_models": (("upscale_models",), _PT),
    "custom_nodes": ((), frozenset()),
    "hypernetworks": (("hypernetworks",), _PT),
    "photomaker": (("photomaker",), _PT),
    "classifiers": (("classifiers",), frozenset({""})),
    "model_patches": (("model_patches",), _PT),
    "audio_encoders": (("audio_encoders",), _PT),
}


class NodeCatalog(Protocol):
    """Where `/object_info` comes from: the engine, or the whole fleet."""

    @property
    def registry(self) -> NodeRegistry: ...

    def object_info(
        self, class_type: str | None = None, folders: Folders | None = None
    ) -> dict[str, Any]: ...


def system_routes(
    engine: Engine,
    *,
    version: str,
    max_upload_bytes: int,
    models_root: Path | None = None,
    catalog: NodeCatalog | None = None,
    folders_for: Callable[[web.Request], Folders] | None = None,
    redact: Callable[[Sequence[str]], list[str]] = list,
) -> list[Route]:
    """`folders_for`: the folders whose files `/object_info` lists for a request (its
    tenant's), by default the engine's; `redact` hides secrets in the argv reported."""
    nodes: NodeCatalog = catalog or engine
    torch_version = _torch_version()
    features = {"supports_preview_metadata": True, "max_upload_size": max_upload_bytes}

    def folders_of(request: web.Request) -> Folders | None:
        return None if folders_for is None else folders_for(request)

    async def object_info(request: web.Request) -> web.StreamResponse:
        # Thread: INPUT_TYPES may list folders, and the full dump is large to serialise.
        return _json_text(await asyncio.to_thread(_all_object_info, nodes, folders_of(request)))

    async def object_info_node(request: web.Request) -> web.StreamResponse:
        node_class = request.match_info["node_class"]
        folders = folders_of(request)
        return _json_text(await asyncio.to_thread(_one_object_info, nodes, node_class, folders))

    async def system_stats(request: web.Request) -> web.StreamResponse:
        stats = await asyncio.to_thread(_system_stats, version, torch_version, redact)
        return web.json_response(stats)

    async def get_features(request: web.Request) -> web.StreamResponse:
        return web.json_response(features)

    async def embeddings(request: web.Request) -> web.StreamResponse:
        files = await asyncio.to_thread(list_model_files, models_root, "embeddings")
        return web.json_response([os.path.splitext(name)[0] for name in files])

    async def model_types(request: web.Request) -> web.StreamResponse:
        return web.json_response(list(MODEL_FOLDERS))

    async def models(request: web.Request) -> web.StreamResponse:
        folder = request.match_info["folder"]
        if folder not in MODEL_FOLDERS:
            return web.Response(status=404)
        return web.json_response(await asyncio.to_thread(list_model_files, models_root, folder))

    async def free(request: web.Request) -> web.StreamResponse:
        return await _free(engine, request)

    return [
        Route("GET", "/object_info", object_info),
        Route("GET", "/object_info/{node_class}", object_info_node),
        Route("GET", "/system_stats", system_stats),
        Route("GET", "/features", get_features),
        Route("GET", "/embeddings", embeddings),
        Route("GET", "/models", model_types),
        Route("GET", "/models/{folder}", models),
        Route("POST", "/free", free, admin=True),
    ]


def _json_text(body: str) -> web.Response:
    return web.Response(text=body, content_type="application/json")


def _all_object_info(nodes: NodeCatalog, folders: Folders | None = None) -> str:
    """Every node's info; a node whose INPUT_TYPES fails is logged and left out, as in ComfyUI."""
    out: dict[str, Any] = {}
    for name in list(nodes.registry.nodes):
        try:
            out.update(nodes.object_info(name, folders))
        except Exception:
            log.exception("could not build object_info for node %s", name)
    return json.dumps(out)


def _one_object_info(nodes: NodeCatalog, node_class: str, folders: Folders | None = None) -> str:
    return json.dumps(nodes.object_info(node_class, folders))


async def _free(engine: Engine, request: web.Request) -> web.StreamResponse:
    """`{unload_models, free_memory}`: no models are held; free_memory drops cached outputs.

    ComfyUI's free_memory resets its executor caches; the output cache is the equivalent.
    """
    body = await read_json(request)
    if isinstance(body, dict) and body.get("free_memory"):
        engine.cache.clear()
    return empty_ok()


# ---------------------------------------------------------------- /system_stats


def _system_stats(
    version: str, torch_version: str, redact: Callable[[Sequence[str]], list[str]] = list
) -> dict[str, Any]:
    ram_total, ram_free = memory_bytes()
    system = {
        "os": os.name,
        "ram_total": ram_total,
        "ram_free": ram_free,
        "comfyui_version": COMFYUI_VERSION,
        **_PINNED_VERSIONS,
        "python_version": sys.version,
        "pytorch_version": torch_version,
        "embedded_python": False,
        "argv": redact(sys.argv),
        "comfyfleet_version": version,
    }
    # ComfyUI's CPU device entry: RAM doubles as "VRAM", and a CPU has no index.
    device = {
        "name": "cpu",
        "type": "cpu",
        "index": None,
        "vram_total": ram_total,
        "vram_free": ram_free,
        "torch_vram_total": ram_total,
        "torch_vram_free": ram_free,
    }
    return {"system": system, "devices": [device]}


def _torch_version() -> str:
    """The installed torch version, read from package metadata so torch is never imported.

    Clients type this field as a string, so an absent torch is reported as "none".
    """
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def memory_bytes() -> tuple[int, int]:
    """Total and available RAM in bytes, (0, 0) when the platform does not tell."""
    try:
        psutil: Any = importlib.import_module("psutil")
    except ImportError:
        psutil = None
    if psutil is not None:
        info = psutil.virtual_memory()
        return int(info.total), int(info.available)
    return _proc_meminfo() or _sysconf_memory()


def _proc_meminfo() -> tuple[int, int] | None:
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                key, _, rest = line.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    values[key] = int(fields[0]) * 1024  # reported in kB
    except OSError:
        return None
    if "MemTotal" not in values:
        return None
    return values["MemTotal"], values.get("MemAvailable", values.get("MemFree", 0))


def _sysconf_memory() -> tuple[int, int]:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0, 0
    try:
        free = page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        free = 0
    return total, free


# ---------------------------------------------------------------- model folders


def list_model_files(models_root: Path | None, folder: str) -> list[str]:
    """The files of a model folder, as paths relative to its directories, sorted."""
    directories, extensions = MODEL_FOLDERS[folder]
    if models_root is None:
        return []
    found: set[str] = set()
    for directory in directories:
        for name in _walk(models_root / directory):
            if not extensions or os.path.splitext(name)[1].lower() in extensions:
                found.add(name)
    return sorted(found)


def _walk(root: Path) -> list[str]:
    """Every file under `root`, relative to it; links are followed, each directory once."""
    out: list[str] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link loop, or two links to one directory
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        out.extend(os.path.relpath(os.path.join(dirpath, f), root) for f in filenames)
    return out
