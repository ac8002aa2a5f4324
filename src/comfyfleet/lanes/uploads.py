"""Pushing the gateway's uploaded input files to a backend before a prompt runs there.

Every tenant, `default` included, has its files pushed under
`_tenants/<name>/<content hash>/` on the backend, and the prompt sent there names them
so. No prompt may name that space itself (the gateway refuses such a name), so a
tenant sharing a backend never reads or overwrites another's files, and a file once
pushed is known by its content, whatever happened to other names since.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from comfyfleet.engine.nodedef import NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders, UnsafePath
from comfyfleet.lanes.backend import BackendClient, BackendError
from comfyfleet.protocol.prompt import is_large, is_link
from comfyfleet.tenants import DEFAULT_TENANT

UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "upload")
#: Where tenants' files go on a backend (under its input, output or temp folder).
TENANT_PREFIX = "_tenants"

#: Brings the files that prompt input values name (`sub/x.png [input]`) into `folders`
#: where another gateway has them: (values, folders, tenant). Files found nowhere are
#: left for validation (or the node) to report.
FetchInputs = Callable[[Sequence[str], Folders, str], Awaitable[None]]


class ForeignFile(ComfyfleetError, ValueError):
    """A prompt names a file in the tenants' space on a backend (which only the gateway
    fills) or outside the backend's folder, and the gateway has no such file of its own."""

    def __init__(self, node_id: str, name: str, value: str) -> None:
        super().__init__(f"node {node_id}: {name} {value!r} is not a file of yours")
        self.node_id, self.name, self.value = node_id, name, value


def forbidden(relative: str) -> bool:
    """Whether a file name, as a prompt gives it, points into the tenants' space on a
    backend or out of its folder (absolute, a drive, `..`)."""
    path = relative.replace("\\", "/")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        return True
    first = posixpath.normpath(path).split("/")[0]
    return first in (TENANT_PREFIX, "..")


def _upload_inputs(info: dict[str, Any]) -> set[str]:
    names = set()
    for section in ("required", "optional"):
        for name, spec in ((info.get("input") or {}).get(section) or {}).items():
            options = spec[1] if isinstance(spec, list | tuple) and len(spec) > 1 else {}
            if isinstance(options, dict) and any(options.get(f) for f in UPLOAD_FLAGS):
                names.add(name)
    return names


class UploadInputs:
    """Which inputs of each node class name an uploaded file (their INPUT_TYPES flags),
    read once per class: INPUT_TYPES may list a folder, so a class not seen yet is read
    in a worker thread."""

    def __init__(self) -> None:
        # Weak: a rebuilt node union drops its old stand-ins, and their entries with them.
        self._known: weakref.WeakKeyDictionary[NodeDef, frozenset[str]] = (
            weakref.WeakKeyDictionary()
        )

    async def values(self, registry: NodeRegistry, prompt: Any) -> list[str]:
        """The file names `prompt`'s nodes give to such inputs (links left out); read in a
        worker thread when a class is new or the prompt large."""
        if not isinstance(prompt, dict):
            return []
        nodes = [n for n in prompt.values() if isinstance(n, dict)]
        if is_large(prompt) or any(
            registry.get(str(n.get("class_type"))) not in self._known for n in nodes
        ):
            return await asyncio.to_thread(self._named, registry, nodes)
        return self._named(registry, nodes)

    def _named(self, registry: NodeRegistry, nodes: list[dict[str, Any]]) -> list[str]:
        self._learn({registry.get(str(n.get("class_type"))) for n in nodes})
        named = []
        for node in nodes:
            definition = registry.get(str(node.get("class_type")))
            inputs = node.get("inputs")
            if definition is None or not isinstance(inputs, dict):
                continue
            for name in self._known.get(definition, frozenset()):
                value = inputs.get(name)
                if isinstance(value, str) and not is_link(value):
                    named.append(value)
        return named

    def _learn(self, classes: set[NodeDef | None]) -> None:
        for node in classes:
            if node is None or node in self._known:
                continue
            try:
                raw = node.input_types().raw
            except Exception:  # a node's own code failing: validation will say so
                raw = {}
            self._known[node] = frozenset(_upload_inputs({"input": raw}))


def _split_annotation(value: str) -> tuple[str, str]:
    """`"sub/name.png [input]"` -> ("sub/name.png", "input")."""
    for kind in ("input", "output", "temp"):
        suffix = f" [{kind}]"
        if value.endswith(suffix):
            return value[: -len(suffix)], kind
    return value, "input"


class InputPusher:
    def __init__(
        self,
        client: BackendClient,
        folders: Folders,
        object_info: Callable[[], dict[str, Any]],
        fetch_inputs: FetchInputs | None = None,
    ) -> None:
        self.client = client
        self.folders = folders
        self.object_info = object_info
        self.fetch_inputs = fetch_inputs  # files another gateway holds, brought here first
        self._pushed: set[tuple[str, str]] = set()  # (folder type, path) already there

    def file_inputs(self, prompt: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(node id, input, value) of every input that names an uploaded file: no file
        system access, so most prompts (naming none) need no worker thread at all."""
        info = self.object_info()
        named = []
        for node_id, node in prompt.items():
            uploads = _upload_inputs(info.get(node.get("class_type"), {}))
            for name, value in (node.get("inputs") or {}).items():
                if name in uploads and isinstance(value, str) and not is_link(value):
                    named.append((node_id, name, value))
        return named

    def files_for(
        self, named: list[tuple[str, str, str]], folders: Folders | None = None
    ) -> list[tuple[str, str, str, str, Path]]:
        """(node id, input, relative name, folder type, local path) of the `named` inputs
        whose file the gateway has (in `folders`, by default the gateway's own)."""
        folders = folders or self.folders
        found = []
        for node_id, name, value in named:
            relative, kind = _split_annotation(value)
            try:
                path = folders.resolve_inside(kind, relative)
            except UnsafePath:
                continue
            if path.is_file():
                found.append((node_id, name, relative, kind, path))
        return found

    async def push_for(
        self,
        prompt: dict[str, Any],
        folders: Folders | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> dict[str, Any]:
        """Push the files `prompt` names (from `folders`); the prompt to send the backend,
        which names them where they were pushed. ForeignFile if it names the tenants'
        space on the backend (a file of the tenant's own is pushed out of it first)."""
        candidates = self.file_inputs(prompt)
        if not candidates:
            return prompt
        named = await asyncio.to_thread(self.files_for, candidates, folders)
        if len(named) < len(candidates) and self.fetch_inputs is not None:
            found = {(node_id, name) for node_id, name, *_ in named}
            absent = [value for node_id, name, value in candidates if (node_id, name) not in found]
            await self.fetch_inputs(absent, folders or self.folders, tenant)
            named = await asyncio.to_thread(self.files_for, candidates, folders)
        found = {(node_id, name) for node_id, name, *_ in named}
        for node_id, name, value in candidates:
            if (node_id, name) not in found and forbidden(_split_annotation(value)[0]):
                raise ForeignFile(node_id, name, value)
        if named:
            prompt = {node_id: dict(node) for node_id, node in prompt.items()}
        for node_id, name, relative, kind, path in named:
            data = await asyncio.to_thread(path.read_bytes)
            digest = hashlib.sha256(data).hexdigest()
            place = f"{TENANT_PREFIX}/{tenant}/{digest[:32]}"
            filename = posixpath.basename(relative.replace("\\", "/"))
            node = prompt[node_id]
            node["inputs"] = {**node["inputs"], name: f"{place}/{filename} [{kind}]"}
            await self._push(kind, place, filename, data)
        return prompt

    async def _push(self, kind: str, subfolder: str, filename: str, data: bytes) -> None:
        """Upload once per place: a place is named by its content, and no prompt can name
        (or write) it but through the gateway."""
        key = (kind, f"{subfolder}/{filename}")
        if key in self._pushed:
            return
        form = aiohttp.FormData()
        form.add_field("image", data, filename=filename)
        form.add_field("subfolder", subfolder)
        form.add_field("type", kind)
        form.add_field("overwrite", "true")
        answer = await self.client.request("POST", "/upload/image", data=form, timeout=120.0)
        if not isinstance(answer, dict) or answer.get("name") != filename:
            raise BackendError(f"backend stored {subfolder}/{filename} as {answer}, not so")
        self._pushed.add(key)
