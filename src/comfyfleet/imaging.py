"""Every conversion of image values: arrays <-> Pillow <-> encoded bytes.

IMAGE values are float32 arrays shaped [batch, height, width, channels] in 0..1,
as in ComfyUI; MASK values are float32 [batch, height, width].
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageOps, ImageSequence, PngImagePlugin

try:  # a dependency; a checkout put on another program's path may lack it (Pillow then)
    # Loaded now, not on the first result; "as" marks it public (the tests replace it).
    from imagecodecs import png_decode as png_decode
except ImportError:  # only outside comfyfleet's own install (see the tests)
    png_decode = None  # type: ignore[assignment]

ImageArray = NDArray[np.float32]
MaskArray = NDArray[np.float32]

# ComfyUI's upscale method names, mapped to the Pillow filter that matches each.
RESAMPLE_FILTERS: dict[str, Image.Resampling] = {
    "nearest-exact": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "area": Image.Resampling.BOX,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}

_ORIENTATION = 0x0112  # the EXIF tag

# Multi-picture formats whose extra frames are not an animation (MPO: stereo/preview pairs).
_SINGLE_FRAME_FORMATS = frozenset({"MPO"})


def blank(batch: int, height: int, width: int, color: int = 0) -> ImageArray:
    """A batch filled with one 0xRRGGBB colour."""
    rgb = np.array(
        [(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF], dtype=np.float32
    ) / np.float32(255.0)
    return np.broadcast_to(rgb, (batch, height, width, 3)).astype(np.float32, copy=True)


def to_pil(frame: NDArray[Any]) -> Image.Image:
    """One [H, W, C] frame in 0..1 to an 8-bit Pillow image (RGB, RGBA or L).

    The cast truncates, as ComfyUI's does (0.25 gives 63, not 64): the same workflow must
    save the same pixels on either.
    """
    data = np.clip(np.asarray(frame, dtype=np.float32) * 255.0, 0, 255).astype(np.uint8)
    if data.ndim == 3 and data.shape[2] == 1:
        data = data[:, :, 0]
    return Image.fromarray(data)


def from_pil(image: Image.Image) -> tuple[ImageArray, NDArray[np.float32]]:
    """A Pillow image to a 1-frame IMAGE and its MASK (1 - alpha, zeros without alpha)."""
    if image.getexif().get(_ORIENTATION, 1) != 1:  # without one, it would only copy
        image = ImageOps.exif_transpose(image) or image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode == "I":
        image = image.point(lambda i: i * (1 / 255))
    rgb = np.asarray(image if image.mode == "RGB" else image.convert("RGB"), dtype=np.float32)
    rgb /= np.float32(255.0)  # in place: one full-size array fewer per image
    if "A" in image.getbands():
        alpha = np.asarray(image.getchannel("A"), dtype=np.float32) / np.float32(255.0)
        mask = np.float32(1.0) - alpha
    else:
        mask = np.zeros(rgb.shape[:2], dtype=np.float32)
    return rgb[None, ...], mask[None, ...]


def frames_from_pil(image: Image.Image) -> tuple[ImageArray, MaskArray]:
    """Every frame of a (possibly animated) Pillow image as one IMAGE batch and its MASK.

    Frames whose size differs from the first are skipped, since a batch has one size.
    """
    images: list[ImageArray] = []
    masks: list[MaskArray] = []
    for frame in ImageSequence.Iterator(image):
        rgb, mask = from_pil(frame)
        if images and rgb.shape[1:3] != images[0].shape[1:3]:
            continue
        images.append(rgb)
        masks.append(mask)
    if len(images) > 1 and image.format not in _SINGLE_FRAME_FORMATS:
        return np.concatenate(images), np.concatenate(masks)
    return images[0], masks[0]


def with_channels(images: NDArray[Any], channels: int) -> ImageArray:
    """`images` with exactly `channels` channels: extra ones dropped, missing ones set to 1.0.

    Used to combine RGB with RGBA, where the added channel is an opaque alpha.
    """
    have = images.shape[-1]
    if have == channels:
        return np.asarray(images, dtype=np.float32)
    if have > channels:
        return np.ascontiguousarray(images[..., :channels], dtype=np.float32)
    pad = np.ones((*images.shape[:-1], channels - have), dtype=np.float32)
    return np.concatenate([np.asarray(images, dtype=np.float32), pad], axis=-1)


def crop_to_aspect(images: NDArray[Any], width: int, height: int) -> ImageArray:
    """The centre of each frame with the aspect ratio of `width` x `height` (ComfyUI's crop)."""
    old_h, old_w = images.shape[1:3]
    old_aspect, new_aspect = old_w / old_h, width / height
    x = y = 0
    if old_aspect > new_aspect:
        x = round((old_w - old_w * new_aspect / old_aspect) / 2)
    elif old_aspect < new_aspect:
        y = round((old_h - old_h * old_aspect / new_aspect) / 2)
    return np.asarray(images[:, y : old_h - y, x : old_w - x], dtype=np.float32)


def resize(
    images: NDArray[Any], width: int, height: int, method: str = "bilinear", crop: str = "disabled"
) -> ImageArray:
    """Every frame of an IMAGE batch resized to `width` x `height` with a ComfyUI upscale method.

    Channels are resampled as 32-bit float planes so no precision is lost to 8-bit.
    """
    if crop == "center":
        images = crop_to_aspect(images, width, height)
    resample = RESAMPLE_FILTERS[method]
    batch, _, _, channels = images.shape
    out = np.empty((batch, height, width, channels), dtype=np.float32)
    for b in range(batch):
        for c in range(channels):
            plane = Image.fromarray(np.ascontiguousarray(images[b, :, :, c], dtype=np.float32))
            out[b, :, :, c] = np.asarray(plane.resize((width, height), resample))
    # Bicubic and Lanczos overshoot near edges; an IMAGE stays within 0..1.
    return np.clip(out, 0.0, 1.0, out=out)


def encode_png(
    image: Image.Image, text: dict[str, str] | None = None, compress_level: int = 4
) -> bytes:
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


def has_alpha(image: Image.Image) -> bool:
    """True when the picture carries transparency (an alpha band or a transparent palette entry)."""
    return "A" in image.getbands() or "transparency" in image.info


def encode_web_preview(
    image: Image.Image, fmt: str, quality: int, keep_alpha: bool = True
) -> bytes:
    """`/view?preview=` bytes: WEBP or JPEG at `quality` (clamped to 0..100).

    JPEG has no alpha, so it always gets RGB; WEBP keeps transparency unless told not to.
    """
    fmt = fmt.upper()
    if fmt not in ("WEBP", "JPEG"):
        raise ValueError(f"unsupported preview format {fmt!r}")
    alpha = keep_alpha and fmt == "WEBP" and has_alpha(image)
    converted = image.convert("RGBA" if alpha else "RGB")
    buf = io.BytesIO()
    converted.save(buf, format=fmt, quality=max(0, min(100, quality)))
    return buf.getvalue()


def rgb_png(image: Image.Image) -> bytes:
    """The colour channels only, as PNG (alpha dropped, not composited: ComfyUI's `channel=rgb`)."""
    return encode_png(image.convert("RGB"))


def alpha_png(image: Image.Image) -> bytes:
    """The alpha channel as a black RGBA PNG with that alpha (ComfyUI's `channel=a`).

    A picture without transparency is fully opaque.
    """
    if has_alpha(image):
        alpha = image.convert("RGBA").getchannel("A")
    else:
        alpha = Image.new("L", image.size, 255)
    out = Image.new("RGBA", image.size, (0, 0, 0, 0))
    out.putalpha(alpha)
    return encode_png(out)


def png_text(image: Image.Image) -> dict[str, str]:
    """The PNG text chunks of an opened picture ({} for other formats)."""
    text = getattr(image, "text", None) or {}
    return {str(key): str(value) for key, value in text.items()}


def masked_png(original: Image.Image, mask: Image.Image) -> bytes:
    """`original` with its alpha replaced by the alpha of `mask`, as PNG keeping its text chunks.

    This is what the mask editor uploads to `/upload/mask`. Raises ValueError when the
    two pictures differ in size.
    """
    if original.size != mask.size:
        raise ValueError(f"mask size {mask.size} differs from image size {original.size}")
    text = png_text(original)
    out = original.convert("RGBA")
    out.putalpha(mask.convert("RGBA").getchannel("A"))
    return encode_png(out, text, compress_level=4)


def decode(data: bytes) -> tuple[ImageArray, MaskArray]:
    """Encoded picture bytes (PNG, JPEG, WEBP, ...) to an IMAGE batch and its MASK."""
    with Image.open(io.BytesIO(data)) as picture:
        picture.load()
        return frames_from_pil(picture)


def mapped_image(height: int, width: int) -> ImageArray:
    """A zeroed 1-frame RGB IMAGE whose memory is already written once.

    A fresh array's pages cost a fault each on first write (about as much as decoding
    the picture); made while a remote job runs, they are paid off the path that waits.
    """
    out = np.empty((1, height, width, 3), dtype=np.float32)
    out.fill(0.0)
    return out


def decode_into(data: bytes, out: ImageArray) -> bool:
    """Decode a single-frame RGB picture straight into `out` ([1, H, W, 3]), with the
    same values `decode` gives; False, `out` untouched, when the picture is anything
    else (another size, alpha or palette, frames, an EXIF turn): use `decode` then."""
    size = plain_png_size(data) if png_decode is not None else None
    if size is not None:
        if out.shape != (1, size[1], size[0], 3):
            return False
        try:
            # libpng through imagecodecs: about a third less CPU than Pillow for the
            # same pixels, and it lets go of the interpreter lock while it decodes.
            pixels = png_decode(data)
        except Exception:
            pixels = None  # damaged: Pillow below says what is wrong, as `decode` would
        if pixels is not None and pixels.shape == out.shape[1:] and pixels.dtype == np.uint8:
            np.divide(pixels, np.float32(255.0), out=out[0])
            return True
    with Image.open(io.BytesIO(data)) as picture:
        if (
            picture.mode != "RGB"
            or out.shape != (1, picture.height, picture.width, 3)
            or getattr(picture, "n_frames", 1) != 1
            or picture.getexif().get(_ORIENTATION, 1) != 1
        ):
            return False
        picture.load()
        np.divide(np.asarray(picture), np.float32(255.0), out=out[0])
    return True


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunks that leave an 8-bit RGB PNG's pixels as Pillow reads them (it applies no colour
# profile or gamma). Anything else (tRNS, eXIf, APNG frames, unknown chunks) takes the
# Pillow path, which knows what they mean.
_PLAIN_CHUNKS = frozenset(
    {b"IHDR", b"IDAT", b"IEND", b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"pHYs", b"sBIT", b"tIME"}
)
_TEXT_CHUNKS = frozenset({b"tEXt", b"zTXt", b"iTXt"})
# Pillow reads EXIF (and so a turn) from a text chunk of this name too.
_EXIF_TEXT = b"Raw profile type exif"
# Walking a file's chunks is Python code, with the interpreter lock: a file of many tiny
# chunks (a provider is not trusted) goes to Pillow instead. libpng writes 8 KiB IDATs,
# so this allows a 512 MiB PNG.
MAX_PNG_CHUNKS = 65536


def plain_png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG whose pixels are plain 8-bit RGB, not interlaced, with
    nothing that changes how Pillow reads them; None for anything else."""
    if len(data) < 33 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(data[16:20]), int.from_bytes(data[20:24])
    depth, colour, interlace = data[24], data[25], data[28]
    if depth != 8 or colour != 2 or interlace != 0:
        return None
    position = 8
    for _ in range(MAX_PNG_CHUNKS):
        if position + 8 > len(data):
            return None  # cut short: Pillow says how
        length = int.from_bytes(data[position : position + 4])
        kind = data[position + 4 : position + 8]
        if kind in _TEXT_CHUNKS:
            if data[position + 8 : position + 8 + len(_EXIF_TEXT)] == _EXIF_TEXT:
                return None
        elif kind not in _PLAIN_CHUNKS:
            return None
        if kind == b"IEND":
            return width, height
        position += 12 + length
    return None


def frame_png(images: NDArray[Any], index: int = 0) -> bytes:
    """One frame of an IMAGE batch as PNG bytes (what an API receives as an input image)."""
    return encode_png(to_pil(np.asarray(images)[index]), compress_level=1)


def media_type(data: bytes) -> str:
    """The media type of encoded image (or MP4 video) bytes, by their signature."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    return "application/octet-stream"
