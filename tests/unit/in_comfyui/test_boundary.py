"""Values crossing between ComfyUI and comfyfleet's nodes: tensors in, tensors out."""

from __future__ import annotations

import gc

import numpy as np

from comfyfleet.engine.blocker import ExecutionBlocker
from comfyfleet.fanout.solid_mp4 import solid_mp4
from comfyfleet.fanout.video import video_from_bytes
from comfyfleet.in_comfyui.boundary import Boundary
from tests.unit.in_comfyui.standin import Blocker, Tensor, Torch, VideoFromFile

BOUNDARY = Boundary(Torch(), Blocker, VideoFromFile)


def test_a_tensor_comes_in_as_a_contiguous_float32_array() -> None:
    pixels = np.arange(2 * 3 * 4 * 3, dtype=np.float64).reshape(2, 3, 4, 3)[:, ::-1] / 100
    array = BOUNDARY.to_array(Tensor(pixels))
    assert isinstance(array, np.ndarray)
    assert array.dtype == np.float32 and array.flags.c_contiguous
    assert array.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(array, pixels.astype(np.float32))


def test_lists_of_tensors_come_in_item_by_item_and_other_values_pass() -> None:
    image = Tensor(np.zeros((1, 2, 2, 3), dtype=np.float32))
    converted = BOUNDARY.to_array([image, "text", 3])
    assert isinstance(converted, list) and isinstance(converted[0], np.ndarray)
    assert converted[1:] == ["text", 3]
    config = object()
    assert BOUNDARY.to_array(config) is config


def test_outputs_go_out_as_tensors_and_comfyuis_blocker() -> None:
    image = np.ones((1, 2, 2, 3), dtype=np.float32)
    task_like = object()
    converted = BOUNDARY.result((image, ExecutionBlocker(None), task_like, "status"))
    assert isinstance(converted, tuple) and len(converted) == 4
    assert isinstance(converted[0], Tensor)
    assert converted[0].array is image or np.shares_memory(converted[0].array, image)
    assert isinstance(converted[1], Blocker) and converted[1].message is None
    assert converted[2] is task_like and converted[3] == "status"


def test_a_ui_result_keeps_its_ui_and_converts_its_outputs() -> None:
    image = np.zeros((1, 1, 1, 3), dtype=np.float32)
    converted = BOUNDARY.result({"ui": {"text": ["{}"]}, "result": (image, "{}")})
    assert converted["ui"] == {"text": ["{}"]}
    assert isinstance(converted["result"][0], Tensor) and converted["result"][1] == "{}"


def test_list_outputs_and_non_image_arrays() -> None:
    frames = [np.zeros((1, 1, 1, 3), dtype=np.float32)] * 2
    converted = BOUNDARY.to_comfy(frames)
    assert all(isinstance(item, Tensor) for item in converted)
    counts = np.array([1, 2, 3])  # not an image or mask: left as it is
    assert BOUNDARY.to_comfy(counts) is counts
    blocker = Blocker("stop")
    assert BOUNDARY.to_comfy(blocker) is blocker


def test_a_video_goes_out_as_comfyuis_video_and_its_file_lives_as_long() -> None:
    video = video_from_bytes(solid_mp4(64, 32, (9, 9, 9), 4, 8.0))
    path = video.path
    converted = BOUNDARY.result((video, "status"))
    assert isinstance(converted[0], VideoFromFile) and converted[0].file == str(path)
    assert BOUNDARY.to_comfy([video])[0].file == str(path)  # a list output, item by item
    del video
    gc.collect()
    assert path.is_file()  # ComfyUI holds its value (an output cache, a node's input)
    del converted
    gc.collect()
    assert not path.exists()


def test_without_comfyuis_video_class_a_video_passes_unchanged() -> None:
    video = video_from_bytes(solid_mp4(16, 16, (0, 0, 0), 1, 1.0))
    assert Boundary(Torch(), Blocker).to_comfy(video) is video


def test_a_latent_crosses_as_a_dict_of_tensors_one_level_down() -> None:
    samples = np.zeros((2, 4, 8, 8), dtype=np.float32)
    latent = BOUNDARY.to_array({"samples": Tensor(samples), "batch_index": [0, 1]})
    assert isinstance(latent["samples"], np.ndarray) and latent["batch_index"] == [0, 1]
    out = BOUNDARY.to_comfy({"samples": samples, "noise_mask": samples[:, :1], "note": "x"})
    assert isinstance(out["samples"], Tensor) and isinstance(out["noise_mask"], Tensor)
    assert out["note"] == "x"
    prompt = {"1": {"inputs": {"image": Tensor(samples)}}}  # deeper down: left as it is
    assert BOUNDARY.to_array(prompt) == prompt
