"""What a job's outputs come to in a jobs-API summary: how many files, how many the
editor can show, and the one it shows for the job (its queue and assets panels).

The same counts ComfyUI's `/api/jobs` gives, from a history entry's `outputs`
(node id -> {media type: [items]}), so frontend 1.58 and later fill those panels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Media types the editor previews; others are shown when their format or name says so.
PREVIEWABLE = frozenset({"images", "video", "audio", "3d", "text"})
_THREE_D = (".obj", ".fbx", ".gltf", ".glb", ".usdz")
_TEXT_FILES = (".txt", ".md", ".json")


@dataclass(frozen=True)
class OutputsSummary:
    count: int
    previewable: int
    preview: dict[str, Any] | None

    def fields(self) -> dict[str, Any]:
        return {
            "outputs_count": self.count,
            "previewable_outputs_count": self.previewable,
            "preview_output": self.preview,
        }


NONE = OutputsSummary(0, 0, None)


def _file(item: Any) -> dict[str, Any] | None:
    """An output item as a file entry; a bare 3D file name becomes one, other text none."""
    if isinstance(item, dict):
        return item
    if isinstance(item, str) and item.lower().endswith(_THREE_D):
        return {"filename": item, "type": "output", "subfolder": "", "mediaType": "3d"}
    return None


def _previewable(media: str, item: dict[str, Any]) -> bool:
    fmt = str(item.get("format") or "")
    name = str(item.get("filename") or "").lower()
    return (
        media in PREVIEWABLE
        or fmt.startswith(("video/", "audio/"))
        or name.endswith(_THREE_D + _TEXT_FILES)
    )


def summarize(outputs: dict[str, Any]) -> OutputsSummary:
    """Counts and preview of `outputs`: a saved visual file first, then any other visual
    file, then a saved text file (text never hides an image)."""
    count = previewable = 0
    saved = other = text = None
    for node_id, by_media in outputs.items():
        if not isinstance(by_media, dict):
            continue
        for media, items in by_media.items():
            if media == "animated" or not isinstance(items, list):
                continue  # a flag per image, not files
            for raw in items:
                item = _file(raw)
                if item is None:
                    continue
                count += 1
                if not _previewable(media, item):
                    continue
                previewable += 1
                entry = {**item, "nodeId": node_id, "mediaType": item.get("mediaType", media)}
                name = str(item.get("filename") or "").lower()
                if media == "text" or name.endswith(_TEXT_FILES):
                    text = text or entry
                elif item.get("type") == "output":
                    saved = saved or entry
                else:
                    other = other or entry
    return OutputsSummary(count, previewable, saved or other or text)
