"""A finished job's bytes as the value its task hands on, by the pool it ran in; and what
a failed job hands on when its node skips errors."""

from __future__ import annotations

from typing import Any

from comfyfleet import imaging
from comfyfleet.fanout.video import SKIP_ERROR_SIZE, skipped_clip, video_from_bytes


def result_value(kind: str, data: bytes, into: imaging.ImageArray | None = None) -> Any:
    """An IMAGE array for an image job, a VideoFile for a video job (blocking: decoding
    and writing files; call it in a worker thread). `into`: memory made ready for the
    image while the job ran, used when the picture fits it."""
    if kind == "video":
        return video_from_bytes(data)
    if into is not None and imaging.decode_into(data, into):
        return into
    return imaging.decode(data)[0]


def skipped_value(kind: str) -> Any:
    """What a failed job's node gets when its `skip_error` is on: a white 512x512 image,
    or a short white 512x512 clip for a video job (blocking: the clip is written once)."""
    if kind == "video":
        return skipped_clip()
    return imaging.blank(1, SKIP_ERROR_SIZE, SKIP_ERROR_SIZE, 0xFFFFFF)
