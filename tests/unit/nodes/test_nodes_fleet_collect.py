"""How the fleet's collectors put their children's results together: images and latents
as one batch in order, videos as a list, a failed child's slot as a stand-in."""

from __future__ import annotations

import numpy as np
import pytest

from comfyfleet.fanout.video import placeholder_clip
from comfyfleet.nodes.fleet import (
    PLACEHOLDER_LATENT,
    CollectFromFleet,
    CollectLatentsFromFleet,
    CollectVideosFromFleet,
)


def latent(value: float, batch: int = 1) -> dict[str, np.ndarray]:
    return {"samples": np.full((batch, 4, 2, 3), value, dtype=np.float32)}


def test_latents_are_one_batch_in_order_and_a_failed_child_is_zeros() -> None:
    values = [latent(1.0), None, latent(3.0, batch=2)]
    together = CollectLatentsFromFleet.together(values, [False, True, False])
    samples = together["samples"]
    assert samples.shape == (4, 4, 2, 3) and samples.dtype == np.float32
    assert [float(s.max()) for s in samples] == [1.0, 0.0, 3.0, 3.0]
    none_made = CollectLatentsFromFleet.together([None, None], [True, True])
    assert none_made["samples"].shape == (2, *PLACEHOLDER_LATENT[1:])


def test_latents_of_different_shapes_are_refused() -> None:
    odd = {"samples": np.zeros((1, 4, 3, 3), dtype=np.float32)}
    with pytest.raises(ValueError, match="different shapes"):
        CollectLatentsFromFleet.together([latent(1.0), odd], [False, False])
    with pytest.raises(ValueError, match="not a latent"):
        CollectLatentsFromFleet.together([np.zeros((1, 4, 2, 3))], [False])


def test_images_keep_their_red_placeholder_of_the_others_size() -> None:
    image = np.full((1, 5, 7, 3), 0.5, dtype=np.float32)
    together = CollectFromFleet.together([image, None], [False, True])
    assert together.shape == (2, 5, 7, 3)
    assert together[1, 0, 0].tolist() == [1.0, 0.0, 0.0]


def test_videos_are_a_list_in_order_and_a_failed_childs_is_the_placeholder_clip() -> None:
    assert CollectVideosFromFleet.OUTPUT_IS_LIST == (True, False)
    first, second = object(), object()
    videos = CollectVideosFromFleet.together([first, None, second], [False, True, False])
    assert videos == [first, placeholder_clip(), second]
