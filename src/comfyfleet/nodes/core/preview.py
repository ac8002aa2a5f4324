"""PreviewAny: shows any value as text on the node."""

from __future__ import annotations

import json
from typing import Any


def preview_text(source: Any) -> str:
    """`source` as ComfyUI's PreviewAny shows it: strings as-is, numbers via str, else JSON."""
    if source is None:
        return "None"
    if isinstance(source, str):
        return source
    if isinstance(source, int | float | bool):
        return str(source)
    try:
        return json.dumps(source)
    except Exception:
        # Not JSON-serialisable (arrays, objects): fall back to their repr-like str.
        try:
            return str(source)
        except Exception:
            return "source exists, but could not be serialized."


class PreviewAny:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"source": ("*", {})}}

    RETURN_TYPES = ()
    FUNCTION = "main"
    OUTPUT_NODE = True
    CATEGORY = "utils"

    def main(self, source: Any = None) -> dict[str, Any]:
        return {"ui": {"text": [preview_text(source)]}}


NODE_CLASS_MAPPINGS: dict[str, type] = {"PreviewAny": PreviewAny}
NODE_DISPLAY_NAME_MAPPINGS = {"PreviewAny": "Preview Any"}
PYTHON_MODULES = {"PreviewAny": "comfy_extras.nodes_preview_any"}
