"""Bringing a backend's output files into the gateway's own folders.

History and `/view` then keep working after the backend restarts or forgets
its history. Names are kept when free; a different file under the same name
gets a numbered name, so nothing is ever overwritten.

A backend is not trusted with the gateway's disk: every file it names must be one
plain file name in a plain relative subfolder (`UnsafeOutput` otherwise), and the
folder a copy goes to is resolved and checked to lie in the tenant's folder.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from comfyfleet.domain.jobs import OutputFile
from comfyfleet.folders import Folders, UnsafePath, plain_name, plain_subfolder
from comfyfleet.lanes.backend import BackendError
from comfyfleet.nodes.core.saving import SharedCounters
from comfyfleet.peers.names import SHARED_TYPES

Fetch = Callable[[str, str, str], Awaitable[bytes]]  # (filename, subfolder, type) -> bytes
COPIED_TYPES = ("output", "temp")


class UnsafeOutput(BackendError):
    """A backend named an output file the gateway does not write, keep or pass on."""


def is_file_item(item: Any) -> bool:
    """Whether a UI output item names a file (`filename`, `subfolder`, `type`)."""
    return isinstance(item, dict) and "filename" in item


def checked_item(item: dict[str, Any]) -> tuple[str, str, str]:
    """(filename, subfolder, type) of a file item a backend reported; UnsafeOutput unless
    the name is one plain file name and the subfolder plain relative names."""
    kind = item.get("type", "output")
    try:
        if not isinstance(kind, str):
            raise UnsafePath(f"{kind!r} is not a folder type")
        return plain_name(item["filename"]), plain_subfolder(item.get("subfolder", "")), kind
    except UnsafePath as exc:
        raise UnsafeOutput(f"output file refused: {exc}") from exc


#: `<prefix>_<counter>_.<ext>`, as ComfyUI's savers name files (some leave out the last `_`).
COUNTED_NAME = re.compile(r"^(?P<prefix>.+?)_\d{5,}(?P<tail>_?)(?P<suffix>\.[^.]*)?$")


def fleet_name(folder: Path, filename: str, counters: SharedCounters) -> str:
    """The name a copy gets where gateways share a store: the backend counted its files
    from its own folder, so its counter is replaced by one the store hands out for the
    same folder and prefix as a save there, never a name another gateway was given."""
    match = COUNTED_NAME.match(filename)
    if match:
        prefix, tail, suffix = match["prefix"], match["tail"], match["suffix"] or ""
    else:
        (prefix, suffix), tail = os.path.splitext(filename), "_"
    counter = counters.reserve(folder, prefix, 1, 1)
    return f"{prefix}_{counter:05}{tail}{suffix}"


def _claim(
    folders: Folders,
    key: tuple[str, str, str],
    data: bytes,
    counters: SharedCounters | None = None,
) -> str:
    """Write `data` under the file `key` names (an output renamed by `counters`, if given), or the
    first free numbered variant; returns the name. The folder is resolved and checked to
    lie in its root (a link there that leads out of it is refused); new names are
    created exclusively, never through a link."""
    filename, subfolder, kind = key
    try:
        folder = folders.resolve_inside(kind, subfolder)
    except UnsafePath as exc:
        raise UnsafeOutput(f"output file refused: {exc}") from exc
    folder.mkdir(parents=True, exist_ok=True)
    if counters is not None and kind in SHARED_TYPES:
        filename = fleet_name(folder, filename, counters)
    stem, suffix = os.path.splitext(filename)
    for n in range(10_000):
        name = filename if n == 0 else f"{stem}_{n}{suffix}"
        path = folder / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _holds(path, data):
                return name  # the same file copied before (e.g. a resumed job)
            continue
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return name
    raise OSError(f"no free name for {filename} in {folder}")


def _holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a regular file (not a link) holding exactly `data`."""
    info = os.lstat(path)
    return stat.S_ISREG(info.st_mode) and info.st_size == len(data) and path.read_bytes() == data


class OutputCopier:
    """Copies the files a prompt's UI outputs name, remembering each copy."""

    def __init__(self, folders: Folders, fetch: Fetch, counters: SharedCounters | None) -> None:
        self.folders = folders
        self.fetch = fetch
        self.counters = counters  # names from the store, with gateways that share it
        self._copied: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def localize(self, ui: Any) -> Any:
        """The same UI output with every file item pointing at the gateway's copy;
        UnsafeOutput if one names a file it may not (nothing is written for that one)."""
        if not isinstance(ui, dict):
            return ui
        return {
            key: [await self._item(item) for item in items] if isinstance(items, list) else items
            for key, items in ui.items()
        }

    async def _item(self, item: Any) -> Any:
        if not is_file_item(item):
            return item
        key = checked_item(item)
        if key[2] not in COPIED_TYPES:
            return item
        if key not in self._copied:
            data = await self.fetch(*key)
            name = await asyncio.to_thread(_claim, self.folders, key, data, self.counters)
            self._copied[key] = {**item, "filename": name}
        return self._copied[key]


class OutputReferencer:
    """Reference mode: files stay on the backend; the gateway's `/view` fetches them there.

    Items get the subfolder `@<backend>/<subfolder>`, which the gateway's `/view`
    recognises; clients pass filename and subfolder back unchanged, as always.
    """

    PREFIX = "@"

    def __init__(self, backend: str) -> None:
        self.backend = backend

    async def localize(self, ui: Any) -> Any:
        if not isinstance(ui, dict):
            return ui
        return {
            key: [self._item(item) for item in items] if isinstance(items, list) else items
            for key, items in ui.items()
        }

    def _item(self, item: Any) -> Any:
        if not is_file_item(item):
            return item
        _name, sub, kind = checked_item(item)
        if kind not in COPIED_TYPES:
            return item
        return {**item, "subfolder": f"{self.PREFIX}{self.backend}" + (f"/{sub}" if sub else "")}


def split_reference(subfolder: str) -> tuple[str, str] | None:
    """`@gpu0/a/b` -> ("gpu0", "a/b"); None for an ordinary subfolder."""
    if not subfolder.startswith(OutputReferencer.PREFIX):
        return None
    backend, _, rest = subfolder[len(OutputReferencer.PREFIX) :].partition("/")
    return backend, rest


def output_files(outputs: dict[str, Any]) -> list[OutputFile]:
    """The files a prompt's UI outputs name (images, gifs, videos, ...)."""
    files = []
    for ui in outputs.values():
        if not isinstance(ui, dict):
            continue
        for items in ui.values():
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict) and isinstance(item.get("filename"), str):
                    if split_reference(str(item.get("subfolder", ""))):
                        continue  # kept on its backend: nothing here to prune
                    files.append(
                        OutputFile(
                            item["filename"], item.get("subfolder", ""), item.get("type", "output")
                        )
                    )
    return files
