"""Asset blobs are named by their bytes' blake3 hash (`assets/<hex><ext>` in a tenant's
input folder, see comfyfleet.domain.assets), so a copy of one fetched from a peer can be
checked: bytes that do not have the hash its name says are not kept. The peer is
untrusted, and a wrong copy would be served as the asset from then on.
"""

from __future__ import annotations

import re

import blake3

from comfyfleet.domain.assets import BLOB_FOLDER
from comfyfleet.errors import ComfyfleetError

_BLOB = re.compile(r"([0-9a-f]{64})(\.[^/]*)?")


class NotTheHash(ComfyfleetError):
    """A peer sent bytes other than those the blob's name promises."""


def promised_hash(kind: str, subfolder: str, name: str) -> str | None:
    """The blake3 hex digest the file's bytes must have (a blob), or None (any file)."""
    if kind != "input" or subfolder != BLOB_FOLDER:
        return None
    found = _BLOB.fullmatch(name)
    return found.group(1) if found else None


class BlobCheck:
    """Hashes what is written, for a file whose bytes are promised by its name."""

    def __init__(self, hex_digest: str) -> None:
        self._promised = hex_digest
        self._hasher = blake3.blake3()

    def update(self, data: bytes) -> None:
        self._hasher.update(data)

    def verify(self) -> None:
        """NotTheHash unless the bytes written have the promised hash."""
        if self._hasher.hexdigest() != self._promised:
            raise NotTheHash(f"the bytes do not have the blake3 hash {self._promised[:12]}…")
