"""Bringing a backend's output files into the gateway's own folders.

History and `/view` then keep working after the backend restarts or forgets
its history. Names are kept when free; a different file under the same name
gets a numbered name, so nothing is ever overwritten.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from comfyfleet.folders import Folders
from comfyfleet.store.records import OutputFile

Fetch = Callable[[str, str, str], Awaitable[bytes]]  # (filename, subfolder, type) -> bytes
COPIED_TYPES = ("output", "temp")


def _claim(folder: Path, filename: str, data: bytes) -> str:
    """Write `data` under `filename` or the first free numbered variant; returns the name."""
    folder.mkdir(parents=True, exist_ok=True)
    stem, suffix = os.path.splitext(filename)
    for n in range(10_000):
        name = filename if n == 0 else f"{stem}_{n}{suffix}"
        path = folder / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if path.read_bytes() == data:
                return name  # the same file copied before (e.g. a resumed job)
            continue
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return name
    raise OSError(f"no free name for {filename} in {folder}")


class OutputCopier:
    """Copies the files a prompt's UI outputs name, remembering each copy."""

    def __init__(self, folders: Folders, fetch: Fetch) -> None:
        self.folders = folders
        self.fetch = fetch
        self._copied: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def localize(self, ui: Any) -> Any:
        """The same UI output with every file item pointing at the gateway's copy."""
        if not isinstance(ui, dict):
            return ui
        return {
            key: [await self._item(item) for item in items] if isinstance(items, list) else items
            for key, items in ui.items()
        }

    async def _item(self, item: Any) -> Any:
        if not (isinstance(item, dict) and isinstance(item.get("filename"), str)):
            return item
        kind = item.get("type", "output")
        if kind not in COPIED_TYPES:
            return item
        key = (item["filename"], item.get("subfolder", ""), kind)
        if key not in self._copied:
            data = await self.fetch(*key)
            root = self.folders.of_type(kind)
            assert root is not None
            folder = (root / key[1]).resolve()
            if not folder.is_relative_to(root.resolve()):
                raise ValueError(f"backend output escapes the {kind} folder: {key[1]!r}")
            name = await asyncio.to_thread(_claim, folder, key[0], data)
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
        if not (isinstance(item, dict) and isinstance(item.get("filename"), str)):
            return item
        if item.get("type", "output") not in COPIED_TYPES:
            return item
        sub = str(item.get("subfolder", ""))
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
