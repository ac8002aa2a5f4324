"""VIDEO values: a file reference plus metadata, which collectors pass through unchanged.

A failed video slot in placeholder mode gets a short blank clip marked as a
placeholder, never something that could pass for a real result.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from comfyfleet import imaging
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
