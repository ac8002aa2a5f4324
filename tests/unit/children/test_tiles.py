"""Tiles cut with overlap and stitched back: exact for per-pixel work, scaled work too."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comfyfleet.children.tiles import TilingError, boxes, cut, stitch


def image(height: int, width: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).integers(0, 256, (1, height, width, 3))
    return (values / 255.0).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(4, 70),
    width=st.integers(4, 70),
    columns=st.integers(1, 4),
    rows=st.integers(1, 4),
    overlap=st.integers(0, 9),
)
def test_per_pixel_work_on_tiles_equals_it_on_the_whole(
    height: int, width: int, columns: int, rows: int, overlap: int
) -> None:
    whole = image(height, width, height * width)
    tiles = boxes(height, width, columns, rows, overlap)
    assert len(tiles) == columns * rows
    inverted = [np.float32(1.0) - t for t in cut(whole, tiles)]
    stitched = stitch(inverted, tiles, height, width, overlap)
    assert stitched.dtype == np.float32
    assert np.array_equal(stitched, np.float32(1.0) - whole)


def test_tiles_scaled_by_the_same_factor_stitch_to_the_scaled_whole() -> None:
    whole = image(30, 44)
    tiles = boxes(30, 44, 2, 2, 4)
    doubled = [t.repeat(2, axis=1).repeat(2, axis=2) for t in cut(whole, tiles)]
    stitched = stitch(doubled, tiles, 30, 44, 4)
    assert np.array_equal(stitched, whole.repeat(2, axis=1).repeat(2, axis=2))


def test_work_that_is_not_per_pixel_differs_only_in_the_blend_bands() -> None:
    whole = image(40, 40)
    overlap = 4

    def blur(batch: np.ndarray) -> np.ndarray:  # a 3x3 box blur, edges clamped
        padded = np.pad(batch, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
        h, w = batch.shape[1:3]
        shifted = [padded[:, y : y + h, x : x + w] for y in range(3) for x in range(3)]
        blurred: np.ndarray = np.mean(shifted, axis=0).astype(np.float32)
        return blurred

    tiles = boxes(40, 40, 2, 2, overlap)
    stitched = stitch([blur(t) for t in cut(whole, tiles)], tiles, 40, 40, overlap)
    band = np.zeros((40, 40), dtype=bool)
    band[20 - overlap : 20 + overlap, :] = band[:, 20 - overlap : 20 + overlap] = True
    assert np.allclose(stitched[0][~band], blur(whole)[0][~band], atol=1e-6)
    assert not np.allclose(stitched[0][band], blur(whole)[0][band], atol=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 10, 0, 1, 0), "columns must be 1 to 16"),
        ((10, 10, 1, 17, 0), "rows must be 1 to 16"),
        ((10, 3, 4, 1, 0), "4 columns do not fit in 3 pixels"),
        ((10, 10, 2, 2, -1), "overlap must not be negative"),
    ],
)
def test_impossible_tilings_say_why(args: tuple[int, ...], message: str) -> None:
    with pytest.raises(TilingError, match=message):
        boxes(*args)


def test_tiles_scaled_unevenly_are_refused() -> None:
    tiles = boxes(20, 20, 2, 1, 2)
    parts = cut(image(20, 20), tiles)
    parts[1] = parts[1].repeat(2, axis=1).repeat(2, axis=2)
    with pytest.raises(TilingError, match="not all scaled by the same factor"):
        stitch(parts, tiles, 20, 20, 2)
