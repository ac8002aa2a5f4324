"""Where a process keeps input, output and temp files.

Node classes ask for folders while listing inputs (`LoadImage.INPUT_TYPES`) and
while running, outside any per-prompt object, so the engine publishes its
folders in a context variable around every call into node code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FolderType = Literal["output", "input", "temp"]


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
