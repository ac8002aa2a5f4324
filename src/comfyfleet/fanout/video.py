"""VIDEO values: a file reference plus metadata, which collectors pass through unchanged.

A failed video slot in placeholder mode gets a short blank clip marked as a
placeholder, never something that could pass for a real result.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from comfyfleet import imaging
from comfyfleet.fanout import mp4
from comfyfleet.folders import current_folders

PLACEHOLDER_SIZE = 64


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


def placeholder_clip() -> VideoFile:
    """A blank clip in the temp folder, for a failed slot."""
    folder = current_folders().resolve_inside("temp", "fanout")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"placeholder-{uuid.uuid4().hex}.gif"
    path.write_bytes(imaging.blank_clip(PLACEHOLDER_SIZE, PLACEHOLDER_SIZE))
    return VideoFile(path, "gif", PLACEHOLDER_SIZE, PLACEHOLDER_SIZE, 8.0, 8, placeholder=True)


def downloads_folder() -> Path:
    """Where remote video results are kept as files. Not the engine's folders: a job may
    run (or be re-attached after a restart) with no prompt, and so no folders, around."""
    return Path(tempfile.gettempdir()) / "comfyfleet-videos"


def video_from_bytes(data: bytes) -> VideoFile:
    """A downloaded clip as a VIDEO value: the file named by its digest (the same result
    is one file), its size, duration and frames read from its headers where it has them."""
    folder = downloads_folder()
    folder.mkdir(parents=True, exist_ok=True)
    is_mp4 = mp4.is_mp4(data)
    suffix = "mp4" if is_mp4 else "bin"
    path = folder / f"{hashlib.sha256(data).hexdigest()}.{suffix}"
    if not path.exists():
        partial = path.with_suffix(f".{uuid.uuid4().hex}.part")
        partial.write_bytes(data)
        partial.replace(path)
    info = mp4.read_info(data) if is_mp4 else mp4.Mp4Info()
    return VideoFile(path, suffix, info.width, info.height, info.fps, info.frames)
