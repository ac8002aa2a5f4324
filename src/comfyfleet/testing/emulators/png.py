"""The emulator's images: real PNGs whose size follows the request and whose colour
follows the prompt and seed, so tests can tell results apart and compare them."""

from __future__ import annotations

import hashlib
import io
import math
from typing import Any

from PIL import Image

DEFAULT_BFL_SIZE = (1024, 768)
DEFAULT_OPENAI_SIZE = (1024, 1024)
# Side limits keep a typo such as width=100000 from eating the emulator's memory.
_MIN_SIDE, _MAX_SIDE = 16, 4096
_ASPECT_AREA = 1024 * 1024


def _side(value: Any, default: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return min(_MAX_SIDE, max(_MIN_SIDE, number))


def bfl_size(body: dict[str, Any]) -> tuple[int, int]:
    """width/height when given, else a ~1 MP image in `aspect_ratio` ("16:9"), else 1024x768."""
    if "width" in body or "height" in body:
        return (
            _side(body.get("width"), DEFAULT_BFL_SIZE[0]),
            _side(body.get("height"), DEFAULT_BFL_SIZE[1]),
        )
    ratio = aspect(body.get("aspect_ratio"))
    if ratio is None:
        return DEFAULT_BFL_SIZE
    width = math.sqrt(_ASPECT_AREA * ratio)
    # Multiples of 32, as the FLUX models produce.
    return (
        _side(round(width / 32) * 32, DEFAULT_BFL_SIZE[0]),
        _side(round(width / ratio / 32) * 32, DEFAULT_BFL_SIZE[1]),
    )


def aspect(value: Any) -> float | None:
    if not isinstance(value, str) or ":" not in value:
        return None
    w, _, h = value.partition(":")
    try:
        ratio = float(w) / float(h)
    except (ValueError, ZeroDivisionError):
        return None
    return ratio if 0.05 < ratio < 20 else None


def openai_size(value: Any) -> tuple[int, int]:
    """ "WxH" ("1536x1024"); "auto" and anything unreadable give 1024x1024."""
    if isinstance(value, str) and "x" in value:
        w, _, h = value.partition("x")
        if w.isdigit() and h.isdigit():
            return _side(w, DEFAULT_OPENAI_SIZE[0]), _side(h, DEFAULT_OPENAI_SIZE[1])
    return DEFAULT_OPENAI_SIZE


def colour(prompt: str, seed: Any, index: int = 0) -> tuple[int, int, int]:
    digest = hashlib.sha256(f"{prompt}\0{seed}\0{index}".encode()).digest()
    return digest[0], digest[1], digest[2]


def render_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid PNG; Pillow's encoder is deterministic, so equal inputs give equal bytes."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(buffer, format="PNG")
    return buffer.getvalue()
