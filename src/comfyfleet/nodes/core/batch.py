"""Nodes that join, repeat, slice or regroup IMAGE batches."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging


class ImageBatch:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image1": ("IMAGE",), "image2": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "batch"
    CATEGORY = "image"

    def batch(self, image1: Any, image2: Any) -> tuple[imaging.ImageArray]:
        first = np.asarray(image1, dtype=np.float32)
        second = imaging.with_channels(np.asarray(image2), first.shape[-1])
        if second.shape[1:3] != first.shape[1:3]:
            # A batch has one frame size: image2 is fitted to image1's.
            second = imaging.resize(second, first.shape[2], first.shape[1], "bilinear", "center")
        return (np.concatenate([first, second]),)


class RepeatImageBatch:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "amount": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "repeat"
    CATEGORY = "image/batch"

    def repeat(self, image: Any, amount: int) -> tuple[imaging.ImageArray]:
        # The whole batch repeats (1,2,1,2), as torch's Tensor.repeat does.
        return (np.tile(np.asarray(image, dtype=np.float32), (amount, 1, 1, 1)),)


class ImageFromBatch:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "batch_index": ("INT", {"default": 0, "min": 0, "max": 4095}),
                "length": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "frombatch"
    CATEGORY = "image/batch"

    def frombatch(self, image: Any, batch_index: int, length: int) -> tuple[imaging.ImageArray]:
        frames = np.asarray(image, dtype=np.float32)
        # Out-of-range requests are clamped to the last frames rather than failing.
        start = min(frames.shape[0] - 1, batch_index)
        length = min(frames.shape[0] - start, length)
        return (frames[start : start + length].copy(),)


class RebatchImages:
    """A list of IMAGE batches regrouped, frames in order, into batches of `batch_size`."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "images": ("IMAGE",),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "rebatch"
    CATEGORY = "image/batch"

    def rebatch(self, images: list[Any], batch_size: list[int]) -> tuple[list[imaging.ImageArray]]:
        size = batch_size[0]
        frames = [frame for batch in images for frame in np.asarray(batch, dtype=np.float32)]
        # Frames of different sizes cannot share a batch: that fails, as in ComfyUI.
        return ([np.stack(frames[i : i + size]) for i in range(0, len(frames), size)],)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "ImageBatch": ImageBatch,
    "RepeatImageBatch": RepeatImageBatch,
    "ImageFromBatch": ImageFromBatch,
    "RebatchImages": RebatchImages,
}

NODE_DISPLAY_NAME_MAPPINGS = {"ImageBatch": "Batch Images", "RebatchImages": "Rebatch Images"}

PYTHON_MODULES = {
    "ImageBatch": "nodes",
    "RepeatImageBatch": "comfy_extras.nodes_images",
    "ImageFromBatch": "comfy_extras.nodes_images",
    "RebatchImages": "comfy_extras.nodes_rebatch",
}
