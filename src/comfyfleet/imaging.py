"""Every conversion of image values: arrays <-> Pillow <-> encoded bytes.

IMAGE values are float32 arrays shaped [batch, height, width, channels] in 0..1,
as in ComfyUI; MASK values are float32 [batch, height, width].
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageOps, PngImagePlugin

ImageArray = NDArray[np.float32]


def blank(batch: int, height: int, width: int, color: int = 0) -> ImageArray:
    """A batch filled with one 0xRRGGBB colour."""
    rgb = np.array(
        [(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF], dtype=np.float32
    ) / np.float32(255.0)
    return np.broadcast_to(rgb, (batch, height, width, 3)).astype(np.float32, copy=True)


def to_pil(frame: NDArray[Any]) -> Image.Image:
    """One [H, W, C] frame in 0..1 to an 8-bit Pillow image (RGB, RGBA or L)."""
    data = np.clip(np.asarray(frame, dtype=np.float32) * 255.0, 0, 255).round().astype(np.uint8)
    if data.ndim == 3 and data.shape[2] == 1:
        data = data[:, :, 0]
    return Image.fromarray(data)


def from_pil(image: Image.Image) -> tuple[ImageArray, NDArray[np.float32]]:
    """A Pillow image to a 1-frame IMAGE and its MASK (1 - alpha, zeros without alpha)."""
    image = ImageOps.exif_transpose(image) or image
    if image.mode == "I":
        image = image.point(lambda i: i * (1 / 255))
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255.0)
    if "A" in image.getbands():
        alpha = np.asarray(image.getchannel("A"), dtype=np.float32) / np.float32(255.0)
        mask = np.float32(1.0) - alpha
    else:
        mask = np.zeros(rgb.shape[:2], dtype=np.float32)
    return rgb[None, ...], mask[None, ...]


def encode_png(image: Image.Image, text: dict[str, str] | None = None, compress_level: int = 4) -> bytes:
    """PNG bytes, with `text` written as tEXt chunks (ComfyUI's prompt/workflow metadata)."""
    info = None
    if text:
        info = PngImagePlugin.PngInfo()
        for key, value in text.items():
            info.add_text(key, value)
    buf = io.BytesIO()
    image.save(buf, format="PNG", pnginfo=info, compress_level=compress_level)
    return buf.getvalue()


def encode_preview(image: Image.Image, fmt: str = "JPEG", max_size: int | None = None) -> bytes:
    """Preview bytes for a WebSocket frame (JPEG or PNG), shrunk to `max_size` if given."""
    if max_size is not None and max(image.size) > max_size:
        image = image.copy()
        image.thumbnail((max_size, max_size), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    if fmt.upper() == "PNG":
        image.save(buf, format="PNG", compress_level=1)
    else:
        image.convert("RGB").save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def batch_count(value: Any) -> int:
    """Frames in an IMAGE batch."""
    return int(np.asarray(value).shape[0])
