"""EmptyImage, ImageInvert, ImageBlend and GetImageSize on known pixel values."""

from __future__ import annotations

import numpy as np
import pytest

from comfyfleet.nodes.core.images import EmptyImage, GetImageSize, ImageBlend, ImageInvert
from tests.unit.nodes.conftest import AsNode


def _const(value: float, shape: tuple[int, ...] = (1, 2, 3, 3)) -> np.ndarray:
    return np.full(shape, value, dtype=np.float32)


def test_empty_image_decodes_rgb_color() -> None:
    (image,) = EmptyImage().generate(width=4, height=3, batch_size=2, color=0xFF0000)
    assert image.shape == (2, 3, 4, 3)
    assert image.dtype == np.float32
    assert np.all(image[..., 0] == 1.0)
    assert np.all(image[..., 1:] == 0.0)
    (mixed,) = EmptyImage().generate(width=1, height=1, color=0x00FF80)
    np.testing.assert_allclose(mixed[0, 0, 0], [0.0, 1.0, 128 / 255], rtol=1e-6)


def test_invert() -> None:
    (black,) = EmptyImage().generate(width=5, height=4, color=0)
    (white,) = ImageInvert().invert(black)
    assert white.shape == (1, 4, 5, 3)
    assert np.all(white == 1.0)
    (inverted,) = ImageInvert().invert(_const(0.25))
    np.testing.assert_allclose(inverted, 0.75)


@pytest.mark.parametrize(
    ("mode", "base", "top", "expected"),
    [
        ("normal", 0.2, 0.6, 0.6),
        ("multiply", 0.2, 0.6, 0.12),
        ("screen", 0.2, 0.6, 0.68),
        ("overlay", 0.2, 0.6, 0.24),
        ("overlay", 0.8, 0.6, 0.84),
        ("soft_light", 0.2, 0.6, 0.2496),
        ("soft_light", 0.2, 0.4, 0.168),
        ("soft_light", 0.64, 0.6, 0.672),
        ("difference", 0.6, 0.2, 0.4),
        ("difference", 0.2, 0.6, 0.0),
    ],
)
def test_blend_modes_at_full_factor(mode: str, base: float, top: float, expected: float) -> None:
    (out,) = ImageBlend().blend(_const(base), _const(top), 1.0, mode)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_blend_factor_mixes_with_image1() -> None:
    (half,) = ImageBlend().blend(_const(0.2), _const(0.6), 0.5, "normal")
    np.testing.assert_allclose(half, 0.4, atol=1e-6)
    (none,) = ImageBlend().blend(_const(0.2), _const(0.6), 0.0, "multiply")
    np.testing.assert_allclose(none, 0.2, atol=1e-6)


def test_blend_fits_image2_to_image1() -> None:
    rgba = np.full((1, 8, 10, 4), 0.5, dtype=np.float32)
    (out,) = ImageBlend().blend(_const(0.2, (1, 4, 6, 3)), rgba, 1.0, "multiply")
    assert out.shape == (1, 4, 6, 3)
    np.testing.assert_allclose(out, 0.1, atol=1e-5)


def test_blend_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="Unsupported blend mode"):
        ImageBlend().blend(_const(0.2), _const(0.6), 1.0, "dodge")


def test_get_image_size_sends_text_frame(as_node: AsNode) -> None:
    (image,) = EmptyImage().generate(width=64, height=48, batch_size=2, color=0xFF0000)
    with as_node("9") as control:
        assert GetImageSize().get_size(image, unique_id="4") == (64, 48, 2)
    assert control.texts == [("4", "width: 64, height: 48\n batch size: 2")]


def test_get_image_size_without_unique_id_sends_nothing(as_node: AsNode) -> None:
    with as_node("4") as control:
        assert GetImageSize().get_size(_const(0.0, (3, 5, 7, 3))) == (7, 5, 3)
    assert control.texts == []
