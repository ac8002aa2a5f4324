"""Nodes that make, recolour, combine or measure images."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.engine.context import send_progress_text

MAX_RESOLUTION = 16384
BLEND_MODES = ["normal", "multiply", "screen", "overlay", "soft_light", "difference"]


class EmptyImage:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "width": ("INT", {"default": 512, "min": 1, "max": MAX_RESOLUTION, "step": 1}),
                "height": ("INT", {"default": 512, "min": 1, "max": MAX_RESOLUTION, "step": 1}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
                "color": (
                    "INT",
                    {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1, "display": "color"},
                ),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "generate"
    CATEGORY = "image"

    def generate(
        self, width: int, height: int, batch_size: int = 1, color: int = 0
    ) -> tuple[imaging.ImageArray]:
        return (imaging.blank(batch_size, height, width, color),)


class ImageInvert:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "invert"
    CATEGORY = "image"

    def invert(self, image: Any) -> tuple[imaging.ImageArray]:
        return (np.float32(1.0) - np.asarray(image, dtype=np.float32),)


def _blend(base: Any, top: Any, mode: str) -> Any:
    """The blend-mode result of `top` over `base`, before mixing by the blend factor."""
    if mode == "normal":
        return top
    if mode == "multiply":
        return base * top
    if mode == "screen":
        return 1 - (1 - base) * (1 - top)
    if mode == "overlay":
        return np.where(base <= 0.5, 2 * base * top, 1 - 2 * (1 - base) * (1 - top))
    if mode == "soft_light":
        # The W3C soft-light curve, as ComfyUI uses it.
        d = np.where(base <= 0.25, ((16 * base - 12) * base + 4) * base, np.sqrt(base))
        return np.where(
            top <= 0.5, base - (1 - 2 * top) * base * (1 - base), base + (2 * top - 1) * (d - base)
        )
    if mode == "difference":
        return base - top
    raise ValueError(f"Unsupported blend mode: {mode}")


class ImageBlend:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image1": ("IMAGE", {}),
                "image2": ("IMAGE", {}),
                "blend_factor": (
                    "FLOAT",
                    {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.01},
                ),
                "blend_mode": ("COMBO", {"multiselect": False, "options": list(BLEND_MODES)}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    OUTPUT_TOOLTIPS = (None,)
    FUNCTION = "blend"
    CATEGORY = "image/postprocessing"
    DEPRECATED = False
    EXPERIMENTAL = False
    API_NODE = False

    def blend(
        self, image1: Any, image2: Any, blend_factor: float, blend_mode: str
    ) -> tuple[imaging.ImageArray]:
        base = np.asarray(image1, dtype=np.float32)
        top = imaging.with_channels(np.asarray(image2), base.shape[-1])
        if top.shape[1:] != base.shape[1:]:
            top = imaging.resize(top, base.shape[2], base.shape[1], "bicubic", "center")
        mixed = base * (1 - blend_factor) + _blend(base, top, blend_mode) * blend_factor
        return (np.clip(mixed, 0.0, 1.0).astype(np.float32),)


class GetImageSize:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": ("IMAGE",)}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("INT", "INT", "INT")
    RETURN_NAMES = ("width", "height", "batch_size")
    FUNCTION = "get_size"
    CATEGORY = "image"
    DESCRIPTION = "Returns width and height of the image, and passes it through unchanged."

    def get_size(self, image: Any, unique_id: str | None = None) -> tuple[int, int, int]:
        batch, height, width = (int(n) for n in np.shape(image)[:3])
        if unique_id:
            send_progress_text(f"width: {width}, height: {height}\n batch size: {batch}", unique_id)
        return width, height, batch


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "EmptyImage": EmptyImage,
    "ImageInvert": ImageInvert,
    "ImageBlend": ImageBlend,
    "GetImageSize": GetImageSize,
}

# None: ComfyUI sends `display_name: null` for ImageBlend.
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {
    "ImageBlend": None,
    "ImageInvert": "Invert Image",
    "GetImageSize": "Get Image Size",
}

PYTHON_MODULES = {
    "EmptyImage": "nodes",
    "ImageInvert": "nodes",
    "ImageBlend": "comfy_extras.nodes_post_processing",
    "GetImageSize": "comfy_extras.nodes_images",
}
