"""Comfy API v2 assets: a tenant's named references to content-addressed bytes.

An asset is a record (a UUID, the client's file name and media type) over a blob: bytes
kept once per tenant under their blake3 hash, in the tenant's input folder (so a
workflow's LoadImage reads them as it reads any upload). Many assets may share a blob.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The folder of a tenant's input folder that holds asset blobs.
BLOB_FOLDER = "assets"


@dataclass(frozen=True)
class AssetRecord:
    id: str
    tenant: str
    hash: str  # "blake3:<64 hex digits>"
    size: int
    content_type: str
    file_path: str  # the client's name for it
    blob: str  # where its bytes are, relative to the tenant's input folder
    created_at: float = 0.0  # when the store recorded it (0 before)
