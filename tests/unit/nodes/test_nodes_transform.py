"""ImageScale, ImageScaleBy, ImageCrop, ImagePadForOutpaint and ImageStitch geometry."""

from __future__ import annotations

import numpy as np
import pytest

from comfyfleet.nodes.core.transform import (
    ImageCrop,
    ImagePadForOutpaint,
    ImageScale,
    ImageScaleBy,
    ImageStitch,
)


def _solid(height: int, width: int, rgb: tuple[float, ...], batch: int = 1) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, dtype=np.float32), (batch, height, width, len(rgb))).copy()


def _columns(values: list[float], height: int = 2) -> np.ndarray:
    """A grey image whose pixel columns carry `values`."""
    row = np.array(values, dtype=np.float32)[None, :, None]
    return np.repeat(np.repeat(row, height, axis=0), 3, axis=2)[None]


@pytest.mark.parametrize("method", ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"])
def test_scale_to_size_with_every_method(method: str) -> None:
    image = np.random.default_rng(0).random((2, 6, 8, 3), dtype=np.float32)
    (out,) = ImageScale().upscale(image, method, 12, 9, "disabled")
    assert out.shape == (2, 9, 12, 3)
    assert out.dtype == np.float32
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_scale_nearest_doubles_pixels() -> None:
    checker = np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    image = np.repeat(checker[None, :, :, None], 3, axis=3)
    (out,) = ImageScale().upscale(image, "nearest-exact", 4, 4, "disabled")
    expected = np.kron(checker, np.ones((2, 2), dtype=np.float32))
    np.testing.assert_array_equal(out[0, :, :, 0], expected)


def test_scale_area_averages_blocks() -> None:
    image = _columns([0.0, 0.5, 1.0, 1.0], height=4)
    (out,) = ImageScale().upscale(image, "area", 2, 2, "disabled")
    np.testing.assert_allclose(out[0, :, :, 0], [[0.25, 1.0], [0.25, 1.0]], atol=1e-6)


def test_scale_keeps_each_frame_of_the_batch() -> None:
    image = np.concatenate([_solid(4, 4, (1.0, 0.0, 0.0)), _solid(4, 4, (0.0, 0.0, 1.0))])
    (out,) = ImageScale().upscale(image, "bilinear", 7, 5, "disabled")
    np.testing.assert_allclose(out[0], _solid(5, 7, (1.0, 0.0, 0.0))[0], atol=1e-6)
    np.testing.assert_allclose(out[1], _solid(5, 7, (0.0, 0.0, 1.0))[0], atol=1e-6)


def test_scale_center_crop_keeps_the_middle() -> None:
    image = _columns([0.0, 0.25, 0.5, 1.0], height=2)
    (out,) = ImageScale().upscale(image, "nearest-exact", 2, 2, "center")
    np.testing.assert_allclose(out[0, :, :, 0], [[0.25, 0.5], [0.25, 0.5]])


def test_scale_zero_side_keeps_aspect_and_both_zero_is_identity() -> None:
    image = np.zeros((1, 50, 100, 3), dtype=np.float32)
    assert ImageScale().upscale(image, "bilinear", 40, 0, "disabled")[0].shape == (1, 20, 40, 3)
    assert ImageScale().upscale(image, "bilinear", 0, 10, "disabled")[0].shape == (1, 10, 20, 3)
    assert ImageScale().upscale(image, "bilinear", 0, 0, "disabled")[0].shape == image.shape


def test_scale_by() -> None:
    image = np.zeros((1, 6, 10, 4), dtype=np.float32)
    assert ImageScaleBy().upscale(image, "lanczos", 1.5)[0].shape == (1, 9, 15, 4)
    assert ImageScaleBy().upscale(image, "area", 0.01)[0].shape == (1, 1, 1, 4)


def test_crop_takes_the_requested_window() -> None:
    image = np.arange(2 * 8 * 10 * 3, dtype=np.float32).reshape(2, 8, 10, 3)
    (out,) = ImageCrop().crop(image, width=4, height=3, x=2, y=1)
    np.testing.assert_array_equal(out, image[:, 1:4, 2:6, :])


def test_crop_clamps_origin_and_size_to_the_image() -> None:
    image = np.zeros((1, 8, 10, 3), dtype=np.float32)
    assert ImageCrop().crop(image, width=512, height=512, x=0, y=0)[0].shape == (1, 8, 10, 3)
    assert ImageCrop().crop(image, width=4, height=4, x=50, y=50)[0].shape == (1, 1, 1, 3)


def test_pad_for_outpaint_places_image_and_feathers_padded_sides() -> None:
    image = np.full((2, 16, 16, 3), 0.9, dtype=np.float32)
    out, mask = ImagePadForOutpaint().expand_image(
        image, left=8, top=0, right=0, bottom=8, feathering=4
    )
    assert out.shape == (2, 24, 24, 3)
    assert mask.shape == (1, 24, 24)
    np.testing.assert_allclose(out[:, :16, 8:], 0.9)
    np.testing.assert_allclose(out[:, :, :8], 0.5)
    np.testing.assert_allclose(out[:, 16:], 0.5)
    assert np.all(mask[0, :, :8] == 1.0) and np.all(mask[0, 16:] == 1.0)
    inner = mask[0, :16, 8:]
    # Left side padded: column 0 of the image is fully masked, fading out by column 4.
    np.testing.assert_allclose(inner[5, :5], [1.0, 0.5625, 0.25, 0.0625, 0.0])
    # Bottom padded: the last row is at distance 1 from the edge.
    np.testing.assert_allclose(inner[15, 8], 0.5625)
    # Top and right are not padded, so they do not fade.
    assert inner[0, 8] == 0.0 and inner[8, 15] == 0.0


def test_pad_for_outpaint_skips_feathering_wider_than_half_the_image() -> None:
    image = np.zeros((1, 6, 6, 3), dtype=np.float32)
    _, mask = ImagePadForOutpaint().expand_image(image, 2, 2, 2, 2, feathering=3)
    assert np.all(mask[0, 2:8, 2:8] == 0.0)
    assert mask[0].sum() == 10 * 10 - 36


RED, GREEN = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("direction", "shape", "red_part", "green_part"),
    [
        ("right", (1, 2, 6, 3), np.s_[:, :, :2], np.s_[:, :, 2:]),
        ("left", (1, 2, 6, 3), np.s_[:, :, 4:], np.s_[:, :, :4]),
        ("down", (1, 3, 2, 3), np.s_[:, :2], np.s_[:, 2:]),
        ("up", (1, 3, 2, 3), np.s_[:, 1:], np.s_[:, :1]),
    ],
)
def test_stitch_directions(
    direction: str,
    shape: tuple[int, ...],
    red_part: tuple[slice, ...],
    green_part: tuple[slice, ...],
) -> None:
    red, green = _solid(2, 2, RED), _solid(2, 4, GREEN)
    (out,) = ImageStitch().stitch(red, direction, True, 0, "white", green)
    assert out.shape == shape
    np.testing.assert_allclose(out[red_part], np.broadcast_to(RED, out[red_part].shape))
    np.testing.assert_allclose(out[green_part], np.broadcast_to(GREEN, out[green_part].shape))


def test_stitch_spacing_is_even_and_coloured() -> None:
    red, green = _solid(2, 2, RED), _solid(2, 2, GREEN)
    (out,) = ImageStitch().stitch(red, "right", True, 3, "blue", green)
    assert out.shape == (1, 2, 8, 3)
    np.testing.assert_allclose(out[:, :, 2:6], np.broadcast_to((0.0, 0.0, 1.0), (1, 2, 4, 3)))


def test_stitch_without_matching_pads_the_smaller_image_centred() -> None:
    small, tall = _solid(2, 2, RED), _solid(4, 3, GREEN)
    (out,) = ImageStitch().stitch(small, "right", False, 0, "white", tall)
    assert out.shape == (1, 4, 5, 3)
    np.testing.assert_allclose(out[0, [0, 3], :2], 1.0)
    np.testing.assert_allclose(out[0, 1:3, :2], np.broadcast_to(RED, (2, 2, 3)))


def test_stitch_evens_out_batches_and_channels() -> None:
    rgb = _solid(2, 2, RED)
    rgba = _solid(2, 2, (0.0, 1.0, 0.0, 0.5), batch=3)
    (out,) = ImageStitch().stitch(rgb, "down", True, 0, "white", rgba)
    assert out.shape == (3, 4, 2, 4)
    assert np.all(out[:, :2, :, 3] == 1.0)


def test_stitch_without_image2_returns_image1() -> None:
    image = _solid(2, 2, RED)
    assert ImageStitch().stitch(image, "right", True, 0, "white")[0] is image
