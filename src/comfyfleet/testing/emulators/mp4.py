"""The emulator's videos: small MP4 files whose headers carry the requested size and
length (ftyp, moov with mvhd/tkhd/mdhd/stts, mdat), and whose one sample is the
colour the prompt and seed pick. Enough for a client to read what it got; not
meant to be played."""

from __future__ import annotations

import struct

FPS = 24
_TIMESCALE = 1000
_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)


def _box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def render_mp4(width: int, height: int, seconds: int, rgb: tuple[int, int, int]) -> bytes:
    duration = seconds * _TIMESCALE
    frames = seconds * FPS
    mvhd = _box(
        b"mvhd",
        struct.pack(">IIIII", 0, 0, 0, _TIMESCALE, duration),
        struct.pack(">IH10x", 0x10000, 0x100),  # rate 1.0, volume 1.0
        _MATRIX,
        bytes(24),
        struct.pack(">I", 2),  # next track id
    )
    tkhd = _box(
        b"tkhd",
        struct.pack(">IIII4xI8x", 3, 0, 0, 1, duration),
        struct.pack(">HHH2x", 0, 0, 0),
        _MATRIX,
        struct.pack(">II", width << 16, height << 16),
    )
    mdhd = _box(b"mdhd", struct.pack(">IIIIIHH", 0, 0, 0, FPS, frames, 0x55C4, 0))
    stts = _box(b"stts", struct.pack(">III", 0, 1, frames) + struct.pack(">I", 1))
    stbl = _box(b"stbl", stts)
    trak = _box(b"trak", tkhd, _box(b"mdia", mdhd, _box(b"minf", stbl)))
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso2mp41")
    return ftyp + _box(b"moov", mvhd, trak) + _box(b"mdat", bytes(rgb))
