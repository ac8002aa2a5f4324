"""SaveImageWebsocket: full-size images sent as binary preview frames, nothing on disk."""

from __future__ import annotations

import time
from typing import Any

from comfyfleet import imaging
from comfyfleet.engine.context import ProgressBar


class SaveImageWebsocket:
    """The node ComfyUI ships as its websocket example, built in here for API clients."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"images": ("IMAGE",)}}

    RETURN_TYPES = ()
    FUNCTION = "save_images"
    OUTPUT_NODE = True
    CATEGORY = "api/image"

    def save_images(self, images: Any) -> dict[str, Any]:
        total = imaging.batch_count(images)
        bar = ProgressBar(total)
        for step, frame in enumerate(images):
            bar.update_absolute(step, total, ("PNG", imaging.to_pil(frame), None))
        return {}

    @classmethod
    def IS_CHANGED(cls, images: Any = None) -> float:
        # Always re-run: the frames go to whoever is listening now.
        return time.time()


NODE_CLASS_MAPPINGS = {"SaveImageWebsocket": SaveImageWebsocket}
NODE_DISPLAY_NAME_MAPPINGS = {"SaveImageWebsocket": "SaveImageWebsocket"}
PYTHON_MODULES = {"SaveImageWebsocket": "custom_nodes.websocket_image_save"}
