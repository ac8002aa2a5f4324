"""Nodes that change an image's geometry: scale, crop, pad, stitch."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.nodes.core.images import MAX_RESOLUTION

UPSCALE_METHODS = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
CROP_METHODS = ["disabled", "center"]
STITCH_COLORS: dict[str, tuple[float, float, float]] = {
    "white": (1.0, 1.0, 1.0),
    "black": (0.0, 0.0, 0.0),
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
}


class ImageScale:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        size = {"default": 512, "min": 0, "max": MAX_RESOLUTION, "step": 1}
        return {
            "required": {
                "image": ("IMAGE",),
                "upscale_method": (list(UPSCALE_METHODS),),
                "width": ("INT", dict(size)),
                "height": ("INT", dict(size)),
                "crop": (list(CROP_METHODS),),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "upscale"
    CATEGORY = "image/upscaling"

    def upscale(
        self, image: Any, upscale_method: str, width: int, height: int, crop: str
    ) -> tuple[imaging.ImageArray]:
        image = np.asarray(image, dtype=np.float32)
        if width == 0 and height == 0:
            return (image,)
        old_h, old_w = image.shape[1:3]
        # A zero side follows the other one, keeping the aspect ratio.
        if width == 0:
            width = max(1, round(old_w * height / old_h))
        elif height == 0:
            height = max(1, round(old_h * width / old_w))
        return (imaging.resize(image, width, height, upscale_method, crop),)


class ImageScaleBy:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "upscale_method": (list(UPSCALE_METHODS),),
                "scale_by": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 8.0, "step": 0.01}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "upscale"
    CATEGORY = "image/upscaling"

    def upscale(
        self, image: Any, upscale_method: str, scale_by: float
    ) -> tuple[imaging.ImageArray]:
        old_h, old_w = np.shape(image)[1:3]
        width = max(1, round(old_w * scale_by))
        height = max(1, round(old_h * scale_by))
        return (imaging.resize(np.asarray(image), width, height, upscale_method),)


class ImageCrop:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        size = {"default": 512, "min": 1, "max": MAX_RESOLUTION, "step": 1}
        offset = {"default": 0, "min": 0, "max": MAX_RESOLUTION, "step": 1}
        return {
            "required": {
                "image": ("IMAGE",),
                "width": ("INT", dict(size)),
                "height": ("INT", dict(size)),
                "x": ("INT", dict(offset)),
                "y": ("INT", dict(offset)),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "crop"
    CATEGORY = "image/transform"

    def crop(self, image: Any, width: int, height: int, x: int, y: int) -> tuple[Any]:
        # The origin is clamped into the image so the crop is never empty.
        x = min(x, image.shape[2] - 1)
        y = min(y, image.shape[1] - 1)
        return (image[:, y : y + height, x : x + width, :],)


def _outpaint_feather(
    height: int, width: int, sides: tuple[int, int, int, int], feathering: int
) -> imaging.MaskArray:
    """Mask values over the original image: 1 at a padded edge fading to 0 inward."""
    top, bottom, left, right = sides
    rows = np.arange(height, dtype=np.float32)[:, None]
    cols = np.arange(width, dtype=np.float32)[None, :]
    # An unpadded side is treated as far away, so it never feathers.
    far_h, far_w = np.float32(height), np.float32(width)
    dist = np.minimum.reduce(
        [
            np.broadcast_to(rows if top else far_h, (height, width)),
            np.broadcast_to(height - rows if bottom else far_h, (height, width)),
            np.broadcast_to(cols if left else far_w, (height, width)),
            np.broadcast_to(width - cols if right else far_w, (height, width)),
        ]
    )
    fade = np.clip((feathering - dist) / feathering, 0.0, None)
    return np.asarray(fade * fade, dtype=np.float32)


class ImagePadForOutpaint:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        pad = {"default": 0, "min": 0, "max": MAX_RESOLUTION, "step": 8}
        return {
            "required": {
                "image": ("IMAGE",),
                "left": ("INT", dict(pad)),
                "top": ("INT", dict(pad)),
                "right": ("INT", dict(pad)),
                "bottom": ("INT", dict(pad)),
                "feathering": ("INT", {"default": 40, "min": 0, "max": MAX_RESOLUTION, "step": 1}),
            }
        }

    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "expand_image"
    CATEGORY = "image"

    def expand_image(
        self, image: Any, left: int, top: int, right: int, bottom: int, feathering: int
    ) -> tuple[imaging.ImageArray, imaging.MaskArray]:
        batch, height, width, channels = image.shape
        new_h, new_w = height + top + bottom, width + left + right
        padded = np.full((batch, new_h, new_w, channels), 0.5, dtype=np.float32)
        padded[:, top : top + height, left : left + width, :] = image
        mask = np.ones((new_h, new_w), dtype=np.float32)
        inner = np.zeros((height, width), dtype=np.float32)
        if feathering > 0 and feathering * 2 < min(height, width):
            inner = _outpaint_feather(height, width, (top, bottom, left, right), feathering)
        mask[top : top + height, left : left + width] = inner
        return padded, mask[None, ...]


def _pad_to(image: imaging.ImageArray, axis: int, size: int, value: float) -> imaging.ImageArray:
    """`image` centred along `axis` (1 = height, 2 = width) in `size`, filled with `value`."""
    missing = size - image.shape[axis]
    if missing <= 0:
        return image
    widths = [(0, 0)] * 4
    widths[axis] = (missing // 2, missing - missing // 2)
    return np.pad(image, widths, mode="constant", constant_values=value)


def _repeat_last(image: imaging.ImageArray, batch: int) -> imaging.ImageArray:
    """`image` grown to `batch` frames by repeating its last frame."""
    extra = batch - image.shape[0]
    if extra <= 0:
        return image
    return np.concatenate([image, np.repeat(image[-1:], extra, axis=0)])


class ImageStitch:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image1": ("IMAGE",),
                "direction": (["right", "down", "left", "up"], {"default": "right"}),
                "match_image_size": ("BOOLEAN", {"default": True}),
                "spacing_width": ("INT", {"default": 0, "min": 0, "max": 1024, "step": 2}),
                "spacing_color": (list(STITCH_COLORS), {"default": "white"}),
            },
            "optional": {"image2": ("IMAGE",)},
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "stitch"
    CATEGORY = "image/transform"
    DESCRIPTION = (
        "\nStitches image2 to image1 in the specified direction.\n"
        "If image2 is not provided, returns image1 unchanged.\n"
        "Optional spacing can be added between images.\n"
    )

    def stitch(
        self,
        image1: Any,
        direction: str,
        match_image_size: bool,
        spacing_width: int,
        spacing_color: str,
        image2: Any = None,
    ) -> tuple[Any]:
        if image2 is None:
            return (image1,)
        first = np.asarray(image1, dtype=np.float32)
        second = np.asarray(image2, dtype=np.float32)
        batch = max(first.shape[0], second.shape[0])
        first, second = _repeat_last(first, batch), _repeat_last(second, batch)
        horizontal = direction in ("left", "right")
        # Axis along which the images are joined, and the one they must agree on.
        join, across = (2, 1) if horizontal else (1, 2)
        color = STITCH_COLORS[spacing_color]
        if match_image_size:
            second = _match_size(second, first, horizontal)
        else:
            # Only grey-level colours pad; a coloured spacer still pads with black.
            fill = color[0] if len(set(color)) == 1 else 0.0
            size = max(first.shape[across], second.shape[across])
            first, second = _pad_to(first, across, size, fill), _pad_to(second, across, size, fill)
        channels = max(first.shape[-1], second.shape[-1])
        first = imaging.with_channels(first, channels)
        second = imaging.with_channels(second, channels)
        parts = [second, first] if direction in ("left", "up") else [first, second]
        if spacing_width > 0:
            parts.insert(1, _spacer(first, second, join, spacing_width, color))
        return (np.concatenate(parts, axis=join),)


def _match_size(
    image: imaging.ImageArray, reference: imaging.ImageArray, horizontal: bool
) -> imaging.ImageArray:
    """`image` scaled, keeping its aspect, to the height (or width) of `reference`."""
    ref_h, ref_w = reference.shape[1:3]
    aspect = image.shape[2] / image.shape[1]
    if horizontal:
        width, height = int(ref_h * aspect), ref_h
    else:
        width, height = ref_w, int(ref_w / aspect)
    return imaging.resize(image, max(1, width), max(1, height), "lanczos")


def _spacer(
    first: imaging.ImageArray,
    second: imaging.ImageArray,
    join: int,
    width: int,
    color: tuple[float, float, float],
) -> imaging.ImageArray:
    """A bar of `color` placed between the two images (its width rounded up to even)."""
    width += width % 2
    across = 1 if join == 2 else 2
    shape = [first.shape[0], 0, 0, first.shape[-1]]
    shape[join] = width
    shape[across] = max(first.shape[across], second.shape[across])
    bar = np.zeros(shape, dtype=np.float32)
    rgb = min(3, bar.shape[-1])
    bar[..., :rgb] = color[:rgb]
    if bar.shape[-1] == 4:
        bar[..., 3] = 1.0
    return bar


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "ImageScale": ImageScale,
    "ImageScaleBy": ImageScaleBy,
    "ImageCrop": ImageCrop,
    "ImagePadForOutpaint": ImagePadForOutpaint,
    "ImageStitch": ImageStitch,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "ImageScale": "Upscale Image",
    "ImageScaleBy": "Upscale Image By",
    "ImageCrop": "Image Crop",
    "ImagePadForOutpaint": "Pad Image for Outpainting",
    "ImageStitch": "Image Stitch",
}

PYTHON_MODULES = {
    "ImageScale": "nodes",
    "ImageScaleBy": "nodes",
    "ImageCrop": "comfy_extras.nodes_images",
    "ImagePadForOutpaint": "nodes",
    "ImageStitch": "comfy_extras.nodes_images",
}
