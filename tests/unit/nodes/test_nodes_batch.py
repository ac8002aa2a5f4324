"""ImageBatch, RepeatImageBatch, ImageFromBatch and RebatchImages shapes and frame order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.nodes.core.batch import (
    ImageBatch,
    ImageFromBatch,
    RebatchImages,
    RepeatImageBatch,
)


class ImageListOf:
    """Two IMAGE batches as one list of two."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"first": ("IMAGE",), "second": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"

    def run(self, first: Any, second: Any) -> tuple[list[Any]]:
        return ([first, second],)


@pytest.fixture
def registry(registry: NodeRegistry) -> NodeRegistry:
    registry.add_pack({"ImageListOf": ImageListOf}, pack="tests", python_module="tests")
    return registry


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


async def test_rebatch_images_regroups_a_list_of_batches(engine: Engine) -> None:
    # Batches of 3 and 2 frames (one list of two) regrouped into batches of 2: 2, 2, 1.
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 4, "height": 4, "batch_size": 3, "color": 0},
        },
        "2": {
            "class_type": "EmptyImage",
            "inputs": {"width": 4, "height": 4, "batch_size": 2, "color": 0},
        },
        "3": {"class_type": "ImageListOf", "inputs": {"first": ["1", 0], "second": ["2", 0]}},
        "4": {
            "class_type": "RebatchImages",
            "inputs": {"images": ["3", 0], "batch_size": 2, "color": 0},
        },
        "5": {"class_type": "GetImageSize", "inputs": {"image": ["4", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 2]}},
    }
    checked, result = await engine.run_prompt(prompt)
    assert checked.ok, checked.error
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["6"] == {"text": ["2", "2", "1"]}


def test_rebatch_keeps_frame_order_across_batches() -> None:
    (out,) = RebatchImages().rebatch([_frames(3), _frames(2) + 0.5], [2])
    assert [batch.shape[0] for batch in out] == [2, 2, 1]
    order = np.concatenate([batch[:, 0, 0, 0] for batch in out])
    np.testing.assert_allclose(order, [0.0, 0.1, 0.2, 0.5, 0.6])
