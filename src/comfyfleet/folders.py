"""Where a process keeps input, output and temp files, and the one rule for paths in them.

Node classes ask for folders while listing inputs (`LoadImage.INPUT_TYPES`) and
while running, outside any per-prompt object, so the engine publishes its
folders in a context variable around every call into node code.

Every file the server or a built-in node reads, writes or deletes in a folder is found
with `resolve_inside`: symlinks resolved first, then the result checked to lie in the
(resolved) folder. A link inside a folder may point elsewhere inside it, never out.
"""

from __future__ import annotations

import contextlib
import ntpath
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from comfyfleet.errors import ComfyfleetError

FolderType = Literal["output", "input", "temp"]


class UnsafePath(ComfyfleetError, ValueError):
    """A path that leaves its folder, or a name that is not one plain file name."""


def resolve_inside(root: Path | str, relative: str = "", *, follow_last: bool = True) -> Path:
    """`root/relative` with symlinks resolved; UnsafePath unless it lies in `root`.

    With `follow_last=False` only the folder is resolved and the last component is kept
    as it is (a link there stays the link): what deleting or creating an entry needs.
    """
    if "\x00" in relative:
        raise UnsafePath(f"{relative!r} holds a NUL byte")
    real_root = os.path.realpath(root)
    joined = os.path.join(real_root, relative)
    if follow_last:
        path = checked = os.path.realpath(joined)
    else:
        folder, name = os.path.split(joined)
        if name in ("", ".", ".."):
            raise UnsafePath(f"{relative!r} names no file")
        checked = os.path.realpath(folder)
        path = os.path.join(checked, name)
    if checked != real_root and not checked.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePath(f"{relative!r} is outside the {Path(root).name} folder")
    return Path(path)


def plain_name(name: object) -> str:
    """`name` if it is one plain file name; UnsafePath if it holds a separator (`/` or
    `\\`), is `.` or `..`, starts with a drive (`C:`), holds NUL, or is not a string."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or ntpath.splitdrive(name)[0]
    ):
        raise UnsafePath(f"{name!r} is not a plain file name")
    return name


def plain_subfolder(subfolder: object) -> str:
    """`subfolder` if it is empty or plain names joined by `/` (relative, no `..`);
    UnsafePath otherwise."""
    if subfolder == "":
        return ""
    try:
        if not isinstance(subfolder, str):
            raise UnsafePath("not a string")
        for part in subfolder.split("/"):
            plain_name(part)
    except UnsafePath as exc:
        raise UnsafePath(f"{subfolder!r} is not a plain relative subfolder") from exc
    return subfolder


@dataclass(frozen=True)
class Folders:
    output: Path
    input: Path
    temp: Path

    @classmethod
    def under(cls, root: Path | str) -> Folders:
        base = Path(root).resolve()
        return cls(output=base / "output", input=base / "input", temp=base / "temp")

    def ensure(self) -> Folders:
        for path in (self.output, self.input, self.temp):
            path.mkdir(parents=True, exist_ok=True)
        return self

    def of_type(self, folder_type: str) -> Path | None:
        """The folder for a ComfyUI `type` (`output`, `input`, `temp`), None if unknown."""
        return {"output": self.output, "input": self.input, "temp": self.temp}.get(folder_type)

    def resolve_inside(
        self, folder_type: str, relative: str = "", *, follow_last: bool = True
    ) -> Path:
        """`resolve_inside` on the folder of a ComfyUI `type`; UnsafePath if it is unknown."""
        root = self.of_type(folder_type)
        if root is None:
            raise UnsafePath(f"unknown folder type {folder_type!r}")
        return resolve_inside(root, relative, follow_last=follow_last)


_current: ContextVar[Folders | None] = ContextVar("comfyfleet_folders", default=None)


def current_folders() -> Folders:
    """The folders of the engine calling into node code (or ./ when none is active)."""
    folders = _current.get()
    if folders is None:
        folders = Folders.under(Path.cwd())
    return folders


@contextlib.contextmanager
def using_folders(folders: Folders) -> Iterator[Folders]:
    token = _current.set(folders)
    try:
        yield folders
    finally:
        _current.reset(token)
