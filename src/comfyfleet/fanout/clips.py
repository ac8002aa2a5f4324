"""Where VIDEO values' files live: a folder per process, a file per value, gone with it.

A clip kept here belongs to its VideoFile: the file is deleted when that value is
released (no task, node output or cache entry holds it any more) and, for values
still held, when the process exits. A process's folder is named `live-*` once it
holds the lock file inside it, locked for the process's life; a process killed
before it could clean up leaves its folder with a free lock, and the next process
to keep a clip removes such folders (a bounded number per start). Windows has no
such lock here: a process there removes its own folder only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

from comfyfleet.folders import UnsafePath, resolve_inside

ROOT_NAME = "comfyfleet-videos"
LOCK_NAME = ".lock"
LIVE_PREFIX = "live-"
#: The most left-behind folders one process removes when it starts keeping clips.
MAX_SWEPT = 64


if sys.platform == "win32":

    def _lock(fd: int) -> bool:
        return False  # never known to be left behind: never swept

else:
    import fcntl

    def _lock(fd: int) -> bool:
        """Take a folder's lock without waiting; False when a live process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True


def default_root() -> Path:
    """Not the engine's temp folder: a job may run (or be re-attached after a restart)
    with no prompt, and so no folders, around."""
    return Path(tempfile.gettempdir()) / ROOT_NAME


class ClipFolder:
    """This process's folder under `root`, made (and the root swept) on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._guard = threading.Lock()
        self._folder: Path | None = None
        self._lock_fd: int | None = None

    def write(self, data: bytes, suffix: str) -> Path:
        """A new file holding `data` (blocking); `tie` it to the value that uses it."""
        path = resolve_inside(self.folder(), f"{uuid.uuid4().hex}.{suffix}", follow_last=False)
        path.write_bytes(data)
        return path

    def tie(self, owner: Any, path: Path) -> None:
        """Delete `path` once `owner` is released (or at exit)."""
        weakref.finalize(owner, _remove, path)

    def folder(self) -> Path:
        with self._guard:
            if self._folder is None:
                self.root.mkdir(parents=True, exist_ok=True)
                sweep(self.root)
                self._folder = self._claim()
                weakref.finalize(self, _close, self._folder, self._lock_fd)
            return self._folder

    def _claim(self) -> Path:
        # Locked before it is named live-*: a sweep never sees a live folder unlocked.
        made = Path(tempfile.mkdtemp(prefix="new-", dir=self.root))
        fd = os.open(made / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        _lock(fd)  # a new file: nobody else holds it
        self._lock_fd = fd
        live = made.with_name(LIVE_PREFIX + made.name.removeprefix("new-"))
        made.rename(live)
        return live


def sweep(root: Path, limit: int = MAX_SWEPT) -> int:
    """Remove up to `limit` folders of processes that are gone; how many were removed."""
    removed = 0
    with os.scandir(root) as entries:
        for entry in entries:
            if removed >= limit:
                break
            if entry.name.startswith(LIVE_PREFIX) and entry.is_dir(follow_symlinks=False):
                removed += _remove_if_left(root, entry.name)
    return removed


def _remove_if_left(root: Path, name: str) -> int:
    try:
        folder = resolve_inside(root, name, follow_last=False)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except (OSError, UnsafePath):
        return 0  # being removed by another process, or not one of these folders
    if not _lock(fd):
        os.close(fd)
        return 0  # its process is alive
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
    return 1


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _close(folder: Path, fd: int | None) -> None:
    """At exit (or when the folder object goes): the folder, then its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


#: The process's clips.
CLIPS = ClipFolder(default_root())
