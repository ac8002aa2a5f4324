"""VIDEO values: a file reference plus metadata, which collectors pass through unchanged.

The clips made here (downloads, stand-ins for failed jobs) are MP4 files kept in
this process's clip folder (clips.py) for as long as their value is held. A
failed video slot in placeholder mode gets a short black clip marked as a
placeholder; a failed job with `skip_error` on, a short white one. Neither can
pass for a real result: the status report says the slot failed or was skipped.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from comfyfleet.fanout import mp4
from comfyfleet.fanout.clips import CLIPS
from comfyfleet.fanout.solid_mp4 import solid_mp4

PLACEHOLDER_SIZE = 64
#: What a failed video job's node gets when its `skip_error` is on (as images: white 512x512).
SKIP_ERROR_SIZE = 512
STAND_IN_FRAMES, STAND_IN_FPS = 8, 8.0


@dataclass(frozen=True)
class VideoFile:
    path: Path
    format: str  # "gif", "mp4", "webm", ...
    width: int
    height: int
    fps: float
    frames: int
    placeholder: bool = False

    def get_dimensions(self) -> tuple[int, int]:
        """As ComfyUI's VideoInput reports them: (width, height)."""
        return self.width, self.height

    def save_to(self, path: str | Path) -> None:
        shutil.copyfile(self.path, path)


def video_from_bytes(data: bytes) -> VideoFile:
    """A downloaded clip as a VIDEO value, its size, duration and frames read from its
    headers where it has them; its file lives as long as the value (blocking: writes)."""
    is_mp4 = mp4.is_mp4(data)
    info = mp4.read_info(data) if is_mp4 else mp4.Mp4Info()
    return _kept(data, "mp4" if is_mp4 else "bin", info)


def _kept(data: bytes, suffix: str, info: mp4.Mp4Info, *, placeholder: bool = False) -> VideoFile:
    path = CLIPS.write(data, suffix)
    video = VideoFile(path, suffix, info.width, info.height, info.fps, info.frames, placeholder)
    CLIPS.tie(video, path)
    return video


@functools.cache
def placeholder_clip() -> VideoFile:
    """A short black clip, for a failed slot in placeholder mode (one per process)."""
    return _solid(PLACEHOLDER_SIZE, (0, 0, 0), placeholder=True)


@functools.cache
def skipped_clip() -> VideoFile:
    """A short white clip, for a failed job whose node skips errors (one per process)."""
    return _solid(SKIP_ERROR_SIZE, (255, 255, 255), placeholder=True)


def _solid(size: int, rgb: tuple[int, int, int], *, placeholder: bool) -> VideoFile:
    data = solid_mp4(size, size, rgb, STAND_IN_FRAMES, STAND_IN_FPS)
    return _kept(data, "mp4", mp4.read_info(data), placeholder=placeholder)
