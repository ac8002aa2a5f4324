"""What an MP4 file's headers say: frame size, duration and frame count.

Only the box headers are read (no decoding): `moov/mvhd` for the duration,
`trak/tkhd` for the picture size, `stts` for the number of samples. Every box
is bounded by the bytes given, so a malformed file reads as "not known".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl"})
#: Deeper than any real file nests the boxes read here.
_MAX_DEPTH = 8


@dataclass(frozen=True)
class Mp4Info:
    width: int = 0
    height: int = 0
    seconds: float = 0.0
    frames: int = 0

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def is_mp4(data: bytes) -> bool:
    return data[4:8] == b"ftyp"


def read_info(data: bytes) -> Mp4Info:
    """The video track's size, the movie's duration and the samples of the first track
    that has a picture; zeros for what the file does not say."""
    width = height = frames = 0
    seconds = 0.0
    for kind, body in _boxes(data, 0, len(data), 0):
        if kind == b"mvhd":
            seconds = _duration(body)
        elif kind == b"tkhd" and not width:
            width, height = _picture(body)
        elif kind == b"stts" and not frames:
            frames = _samples(body)
    return Mp4Info(width, height, seconds, frames)


def _boxes(data: bytes, start: int, end: int, depth: int) -> Iterator[tuple[bytes, bytes]]:
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, at)
        header = 8
        if size == 1 and at + 16 <= end:
            (size,) = struct.unpack_from(">Q", data, at + 8)
            header = 16
        elif size == 0:
            size = end - at
        if size < header or at + size > end:
            return
        if kind in _CONTAINERS and depth < _MAX_DEPTH:
            yield from _boxes(data, at + header, at + size, depth + 1)
        else:
            yield kind, data[at + header : at + size]
        at += size


def _duration(body: bytes) -> float:
    version = body[0] if body else -1
    if version == 0 and len(body) >= 20:
        timescale, duration = struct.unpack_from(">II", body, 12)
    elif version == 1 and len(body) >= 32:
        (timescale,) = struct.unpack_from(">I", body, 20)
        (duration,) = struct.unpack_from(">Q", body, 24)
    else:
        return 0.0
    return duration / timescale if timescale else 0.0


def _picture(body: bytes) -> tuple[int, int]:
    # Width and height, 16.16 fixed point, end the box; before them: 52 bytes of
    # fields after version 0's 20, or version 1's 32.
    offset = {0: 76, 1: 88}.get(body[0] if body else -1)
    if offset is None or len(body) < offset + 8:
        return 0, 0
    width, height = struct.unpack_from(">II", body, offset)
    return width >> 16, height >> 16


def _samples(body: bytes) -> int:
    if len(body) < 8:
        return 0
    (entries,) = struct.unpack_from(">I", body, 4)
    entries = min(entries, (len(body) - 8) // 8)
    return sum(struct.unpack_from(">I", body, 8 + 8 * n)[0] for n in range(entries))
