"""Reading an MP4's size, length and frames from its headers (and the emulator's MP4s)."""

from __future__ import annotations

import struct

from comfyfleet.fanout.mp4 import Mp4Info, is_mp4, read_info
from comfyfleet.testing.emulators.mp4 import FPS, render_mp4


def test_the_emulators_clip_reads_back_as_requested() -> None:
    data = render_mp4(1280, 720, 4, (1, 2, 3))
    assert is_mp4(data)
    info = read_info(data)
    assert (info.width, info.height, info.seconds, info.frames) == (1280, 720, 4.0, 4 * FPS)
    assert info.fps == FPS


def test_garbage_and_cut_files_read_as_unknown() -> None:
    data = render_mp4(720, 1280, 8, (9, 9, 9))
    assert read_info(b"not a video at all") == Mp4Info()
    assert not is_mp4(b"not a video at all")
    assert read_info(data[:40]) == Mp4Info()  # the moov box runs past the end: not read


def test_a_box_claiming_more_than_the_file_stops_the_reader() -> None:
    huge = struct.pack(">I4s", 2**31, b"moov") + bytes(64)
    assert read_info(huge) == Mp4Info()
    wide = struct.pack(">I4sQ", 1, b"moov", 2**62) + bytes(64)  # a 64-bit size
    assert read_info(wide) == Mp4Info()
