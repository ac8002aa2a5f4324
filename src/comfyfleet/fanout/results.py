"""A finished job's bytes as the value its task hands on, by the pool it ran in."""

from __future__ import annotations

from typing import Any

from comfyfleet import imaging
from comfyfleet.fanout.video import video_from_bytes


def result_value(kind: str, data: bytes, into: imaging.ImageArray | None = None) -> Any:
    """An IMAGE array for an image job, a VideoFile for a video job (blocking: decoding
    and writing files; call it in a worker thread). `into`: memory made ready for the
    image while the job ran, used when the picture fits it."""
    if kind == "video":
        return video_from_bytes(data)
    if into is not None and imaging.decode_into(data, into):
        return into
    return imaging.decode(data)[0]
