"""What the engine emits while it runs a prompt, into a sink given per prompt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Message:
    """A JSON event: `{"type": type, "data": data}` on the wire."""

    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Restated(Message):
    """A frame the prompt's stream holds already (sent before a restart), sent again for
    the clients connected now: a log of the stream keeps it once."""


@dataclass(frozen=True)
class NodeProgress:
    """One node's entry of its prompt's `progress_state` changed (it started, reported
    progress or finished). ComfyUI sends every started node's entry on each change;
    whoever sends frames keeps the whole (protocol.progress.ProgressState), so a prompt
    of N nodes costs the engine O(N), not O(N²)."""

    prompt_id: str
    node_id: str
    entry: dict[str, Any]


@dataclass(frozen=True)
class PreviewImage:
    """A preview image from a node's progress (binary frame, code 1 or 4 on the wire)."""

    prompt_id: str
    node_id: str
    format: str  # "PNG" or "JPEG"
    data: bytes

    @property
    def mime_type(self) -> str:
        return "image/png" if self.format == "PNG" else "image/jpeg"

    def metadata(self) -> dict[str, Any]:
        """The JSON header of a PREVIEW_IMAGE_WITH_METADATA frame."""
        return {
            "node_id": self.node_id,
            "prompt_id": self.prompt_id,
            "display_node_id": self.node_id,
            "parent_node_id": None,
            "real_node_id": self.node_id,
            "image_type": self.mime_type,
        }


@dataclass(frozen=True)
class ProgressText:
    """Text a node sends for display (binary frame, code 3 on the wire)."""

    prompt_id: str
    node_id: str
    text: str


EngineEvent = Message | NodeProgress | PreviewImage | ProgressText
EventSink = Callable[[EngineEvent], None]


def discard(_event: EngineEvent) -> None:
    """A sink for callers that only want the result."""
