"""ComfyUI's binary WebSocket frames: a 4-byte big-endian event code, then a payload."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

PREVIEW_IMAGE = 1
TEXT = 3
PREVIEW_IMAGE_WITH_METADATA = 4

IMAGE_TYPES = {"JPEG": 1, "PNG": 2}


def preview_image(image_format: str, data: bytes) -> bytes:
    """Code 1: 4-byte image type (1 JPEG, 2 PNG) + image bytes."""
    return struct.pack(">II", PREVIEW_IMAGE, IMAGE_TYPES.get(image_format, 1)) + data


def preview_with_metadata(metadata: dict[str, Any], data: bytes) -> bytes:
    """Code 4: 4-byte metadata length + UTF-8 JSON metadata + image bytes."""
    meta = json.dumps(metadata).encode()
    return struct.pack(">II", PREVIEW_IMAGE_WITH_METADATA, len(meta)) + meta + data


def text(node_id: str, message: str) -> bytes:
    """Code 3: 4-byte node id length + node id + UTF-8 text."""
    node = node_id.encode()
    return struct.pack(">II", TEXT, len(node)) + node + message.encode()


@dataclass(frozen=True)
class Frame:
    """A decoded binary frame (for clients and tests)."""

    event_code: int
    header: dict[str, Any]
    payload: bytes


def decode(frame: bytes) -> Frame:
    if len(frame) < 8:
        raise ValueError("binary frame shorter than its 8-byte header")
    code, first = struct.unpack(">II", frame[:8])
    rest = frame[8:]
    if code == PREVIEW_IMAGE:
        return Frame(code, {"image_type": first}, rest)
    if code == PREVIEW_IMAGE_WITH_METADATA:
        return Frame(code, {"metadata": json.loads(rest[:first])}, rest[first:])
    if code == TEXT:
        return Frame(code, {"node_id": rest[:first].decode()}, rest[first:])
    return Frame(code, {}, rest)
