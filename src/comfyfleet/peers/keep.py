"""Keeping a file fetched from a peer: staged beside its place, then linked there.

The place is resolved and checked to lie in its folder before anything is written; the
bytes are counted against a cap while they arrive; and linking never replaces an entry:
a name another file took meanwhile keeps that file (unless it holds the same bytes, the
fetched copy is dropped). A copy linked in its place is recorded as fetched (see
copies.py), so retention can remove it, and only it. An asset blob's bytes are checked
against the hash its name promises before it is linked (blobs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import AsyncIterator

from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders, plain_name, plain_subfolder
from comfyfleet.peers.blobs import BlobCheck, promised_hash
from comfyfleet.peers.copies import record_path

_BINARY = getattr(os, "O_BINARY", 0)
#: Bytes gathered on the event loop before one write in a worker thread.
_FLUSH_BYTES = 1 << 20


class TooLarge(ComfyfleetError):
    """A peer sent more than the cap."""


class _Staged:
    """A hidden file beside the place, written from worker threads."""

    def __init__(self, folders: Folders, kind: str, subfolder: str, name: str) -> None:
        plain_name(name)
        plain_subfolder(subfolder)
        directory = folders.resolve_inside(kind, subfolder)  # UnsafePath when it leads out
        os.makedirs(directory, exist_ok=True)
        self.place = str(
            folders.resolve_inside(kind, os.path.join(subfolder, name), follow_last=False)
        )
        self.path = os.path.join(os.path.dirname(self.place), f".peer-{secrets.token_hex(8)}.part")
        self.record = record_path(folders, kind, subfolder, name)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, 0o666)
        self._file = os.fdopen(fd, "wb")
        self._sha = hashlib.sha256()
        promised = promised_hash(kind, subfolder, name)
        self._check = BlobCheck(promised) if promised is not None else None

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        if self._check is not None:
            self._check.update(data)

    def settle(self) -> bool:
        """Link the staged file at its place; True when the place now holds these bytes.
        NotTheHash for a blob whose bytes are not those its name promises."""
        self._file.close()
        try:
            if self._check is not None:
                self._check.verify()
            # The record is made first and set in place once the copy is: a copy is
            # never left unknown, and a record from before is replaced.
            records = os.path.dirname(self.record)
            os.makedirs(records, exist_ok=True)
            noted = os.path.join(records, os.path.basename(self.path))
            os.link(self.path, noted)
            try:
                os.link(self.path, self.place)
            except FileExistsError:
                os.unlink(noted)
                return _holds(self.place, self._sha.digest())
            os.replace(noted, self.record)
        finally:
            self.discard()
        return True

    def discard(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _holds(path: str, digest: bytes) -> bool:
    """Whether `path` is a regular file (not a link) holding bytes with this SHA-256."""
    flags = os.O_RDONLY | _BINARY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return False
        sha = hashlib.sha256()
        while block := file.read(_FLUSH_BYTES):
            sha.update(block)
    return sha.digest() == digest


async def keep(
    chunks: AsyncIterator[bytes], folders: Folders, kind: str, subfolder: str, name: str, limit: int
) -> bool:
    """Store what `chunks` yields as `subfolder/name` in the `kind` folder; True when that
    file now holds those bytes. UnsafePath for a place outside the folder, TooLarge past
    `limit` bytes, NotTheHash for an asset blob with other bytes (nothing is left behind
    either way)."""
    staged = await asyncio.to_thread(_Staged, folders, kind, subfolder, name)
    try:
        size, pending = 0, bytearray()
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"more than {limit} bytes")
            pending += chunk
            if len(pending) >= _FLUSH_BYTES:
                await asyncio.to_thread(staged.write, bytes(pending))
                pending.clear()
        await asyncio.to_thread(staged.write, bytes(pending))
    except BaseException:
        await asyncio.to_thread(staged.discard)
        raise
    return await asyncio.to_thread(staged.settle)
