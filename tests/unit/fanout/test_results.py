"""A finished image job decoded into the memory made ready for it while it ran."""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image, ImageCms, PngImagePlugin

from comfyfleet import imaging
from comfyfleet.fanout.results import result_value


def png(mode: str, size: tuple[int, int], colour: object, **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format="PNG", **save)  # type: ignore[arg-type]
    return buffer.getvalue()


def noisy_rgb_png(width: int, height: int) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_made_ready_memory_is_written_once_and_zeroed() -> None:
    memory = imaging.mapped_image(48, 64)
    assert memory.shape == (1, 48, 64, 3) and memory.dtype == np.float32
    assert not memory.any()


def test_an_rgb_picture_decodes_into_its_memory_with_the_values_decode_gives() -> None:
    data = noisy_rgb_png(64, 48)
    memory = imaging.mapped_image(48, 64)
    value = result_value("image", data, memory)
    assert value is memory
    np.testing.assert_array_equal(value, imaging.decode(data)[0])


def test_a_picture_that_does_not_fit_its_memory_is_decoded_as_before() -> None:
    memory = imaging.mapped_image(48, 64)
    others = [
        noisy_rgb_png(32, 48),  # another size than asked for
        png("RGBA", (64, 48), (10, 20, 30, 40)),  # alpha
        png("P", (64, 48), 3),  # a palette
        png("L", (64, 48), 200),  # grey
    ]
    for data in others:
        value = result_value("image", data, memory)
        assert value is not memory
        np.testing.assert_array_equal(value, imaging.decode(data)[0])
    assert not memory.any()  # left untouched


def test_an_animated_png_keeps_every_frame() -> None:
    frames = [Image.new("RGB", (64, 48), (n * 60, 0, 0)) for n in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="PNG", save_all=True, append_images=frames[1:])
    memory = imaging.mapped_image(48, 64)
    value = result_value("image", buffer.getvalue(), memory)
    assert value is not memory and value.shape == (3, 48, 64, 3)


def test_without_memory_an_image_is_decoded_as_before() -> None:
    data = noisy_rgb_png(16, 16)
    np.testing.assert_array_equal(result_value("image", data), imaging.decode(data)[0])


def rgb_png(pixels: np.ndarray, **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", **save)
    return buffer.getvalue()


def test_plain_rgb_pngs_decode_through_libpng_with_the_values_pillow_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert imaging.png_decode is not None, "imagecodecs is a dependency"
    through_libpng: list[int] = []
    libpng = imaging.png_decode

    def counted(data: bytes) -> np.ndarray:
        through_libpng.append(len(data))
        return libpng(data)

    monkeypatch.setattr(imaging, "png_decode", counted)
    pixels = np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    text = PngImagePlugin.PngInfo()
    text.add_text("parameters", "a prompt, seed 7")
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    variants = [
        rgb_png(pixels),
        rgb_png(pixels, optimize=True),  # other row filters
        rgb_png(pixels, compress_level=0),  # stored, not deflated
        rgb_png(pixels, pnginfo=text),  # metadata a provider adds
        rgb_png(pixels, icc_profile=srgb),  # a colour profile (Pillow does not apply it)
    ]
    for data in variants:
        assert imaging.plain_png_size(data) == (64, 48)
        memory = imaging.mapped_image(48, 64)
        assert result_value("image", data, memory) is memory
        np.testing.assert_array_equal(memory, imaging.decode(data)[0])
    assert through_libpng == [len(data) for data in variants]  # none fell back to Pillow


def test_pngs_whose_chunks_change_the_picture_are_left_to_pillow() -> None:
    pixels = np.random.default_rng(6).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    turned = Image.Exif()
    turned[0x0112] = 6  # a quarter turn: the picture is 48 wide once turned
    exif_text = PngImagePlugin.PngInfo()
    exif_text.add_text("Raw profile type exif", "exif\n 10\n45786966000049492a00")
    others = {
        "transparent colour": rgb_png(pixels, transparency=(1, 2, 3)),
        "EXIF turn": rgb_png(pixels, exif=turned.tobytes()),
        "EXIF in a text chunk": rgb_png(pixels, pnginfo=exif_text),
        "grey": png("L", (64, 48), 200),
        "16-bit": rgb_png(pixels[..., 0].astype(np.uint16) * 200),
    }
    for name, data in others.items():
        assert imaging.plain_png_size(data) is None, name
        value = result_value("image", data, imaging.mapped_image(48, 64))
        np.testing.assert_array_equal(value, imaging.decode(data)[0], err_msg=name)


def outcome(decode: Callable[[bytes], np.ndarray], data: bytes) -> object:
    """What decoding gives: the pixels, or the class of the error."""
    try:
        return decode(data)
    except Exception as exc:
        return type(exc)


def test_a_damaged_png_gives_what_decode_gives() -> None:
    data = noisy_rgb_png(64, 48)
    middle = len(data) // 2
    scribbled = data[:middle] + bytes(64) + data[middle + 64 :]  # chunks intact, pixels not
    cut = data[:middle]
    assert imaging.plain_png_size(scribbled) == (64, 48)
    for broken in (scribbled, cut):
        into = outcome(lambda d: result_value("image", d, imaging.mapped_image(48, 64)), broken)
        plain = outcome(lambda d: imaging.decode(d)[0], broken)
        if isinstance(plain, np.ndarray):
            np.testing.assert_array_equal(into, plain)
        else:
            assert into is plain


def test_a_png_of_very_many_chunks_is_left_to_pillow() -> None:
    """Walking chunks holds the interpreter lock: a provider's file of tiny chunks must
    not keep it for long."""
    data = noisy_rgb_png(64, 48)
    idat = data.index(b"IDAT") - 4
    empty = (0).to_bytes(4, "big") + b"IDAT" + zlib.crc32(b"IDAT").to_bytes(4, "big")
    many = data[:idat] + empty * (imaging.MAX_PNG_CHUNKS + 1) + data[idat:]
    fewer = data[:idat] + empty * 100 + data[idat:]
    assert imaging.plain_png_size(fewer) == (64, 48)
    assert imaging.plain_png_size(many) is None
    value = result_value("image", many, imaging.mapped_image(48, 64))
    np.testing.assert_array_equal(value, imaging.decode(data)[0])


def test_without_imagecodecs_a_plain_png_still_decodes_into_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkout on another program's path (ComfyUI's, say) may lack imagecodecs."""
    monkeypatch.setattr(imaging, "png_decode", None)
    data = noisy_rgb_png(64, 48)
    memory = imaging.mapped_image(48, 64)
    assert result_value("image", data, memory) is memory
    np.testing.assert_array_equal(memory, imaging.decode(data)[0])
