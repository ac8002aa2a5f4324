"""The core pack: ComfyUI's image and primitive nodes, with ComfyUI's names and interfaces."""

from __future__ import annotations

from comfyfleet.nodes.core import (
    batch,
    files,
    images,
    latent,
    preview,
    primitives,
    transform,
    video,
    websocket,
)

_MODULES = (images, transform, batch, files, primitives, preview, websocket, video, latent)

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {}
# The module ComfyUI reports for each node in object_info, so clients see the same origin.
PYTHON_MODULES: dict[str, str] = {}

for _module in _MODULES:
    NODE_CLASS_MAPPINGS.update(_module.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(_module.NODE_DISPLAY_NAME_MAPPINGS)
    PYTHON_MODULES.update(_module.PYTHON_MODULES)
