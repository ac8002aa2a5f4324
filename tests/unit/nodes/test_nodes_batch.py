"""ImageBatch, RepeatImageBatch and ImageFromBatch shapes and frame order."""

from __future__ import annotations

import numpy as np

from comfyfleet.nodes.core.batch import ImageBatch, ImageFromBatch, RepeatImageBatch


def _frames(count: int, height: int = 2, width: int = 3) -> np.ndarray:
    """A batch whose frame i is filled with i / 10."""
    values = np.arange(count, dtype=np.float32) / 10
    return np.broadcast_to(values[:, None, None, None], (count, height, width, 3)).copy()


def test_batch_appends_image2_after_image1() -> None:
    (out,) = ImageBatch().batch(_frames(2), _frames(1) + 0.5)
    assert out.shape == (3, 2, 3, 3)
    np.testing.assert_allclose(out[:, 0, 0, 0], [0.0, 0.1, 0.5])


def test_batch_fits_image2_to_image1_size() -> None:
    other = np.full((2, 8, 5, 4), 0.7, dtype=np.float32)
    (out,) = ImageBatch().batch(_frames(1), other)
    assert out.shape == (3, 2, 3, 3)
    np.testing.assert_allclose(out[1:], 0.7, atol=1e-6)


def test_repeat_repeats_the_whole_batch() -> None:
    (out,) = RepeatImageBatch().repeat(_frames(2), 3)
    assert out.shape == (6, 2, 3, 3)
    np.testing.assert_allclose(out[:, 0, 0, 0], [0.0, 0.1, 0.0, 0.1, 0.0, 0.1])


def test_from_batch_slices_and_clamps() -> None:
    frames = _frames(5)
    (middle,) = ImageFromBatch().frombatch(frames, 1, 2)
    np.testing.assert_allclose(middle[:, 0, 0, 0], [0.1, 0.2])
    (past_end,) = ImageFromBatch().frombatch(frames, 10, 3)
    np.testing.assert_allclose(past_end[:, 0, 0, 0], [0.4])
    (too_long,) = ImageFromBatch().frombatch(frames, 3, 10)
    np.testing.assert_allclose(too_long[:, 0, 0, 0], [0.3, 0.4])
    middle[...] = 1.0
    assert frames[1, 0, 0, 0] == np.float32(0.1)
