"""A finished image job decoded into the memory made ready for it while it ran."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

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
