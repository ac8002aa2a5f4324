"""Providers as packages: the pack and the drivers are built from their list, and the
video provider's requests."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.fanout.request import ApiConfig
from comfyfleet.nodes import build_registry, providers
from comfyfleet.nodes.fanout import SUBMIT_PREFIX
from comfyfleet.nodes.providers.openai_videos.nodes import OpenAIVideo

API = ApiConfig("http://127.0.0.1:8299", "env:OPENAI_API_KEY")


def test_every_provider_package_brings_a_driver_and_nodes_into_the_pack() -> None:
    names = [package.DRIVER.name for package in providers.PROVIDERS]
    assert names == ["bfl", "openai", "openai_videos"]
    for package in providers.PROVIDERS:
        for node in package.NODE_CLASS_MAPPINGS:
            assert providers.NODE_CLASS_MAPPINGS[node] is package.NODE_CLASS_MAPPINGS[node]
    assert set(providers.DRIVERS) == set(names)


def test_a_registry_has_every_providers_nodes_and_their_twins() -> None:
    registry = build_registry()
    for package in providers.PROVIDERS:
        assert all(name in registry for name in package.NODE_CLASS_MAPPINGS)
    twin = registry.get(SUBMIT_PREFIX + "OpenAIVideo")
    assert twin is not None and twin.return_types == ("VIDEO_FUTURE",)


def video_inputs(**changes: Any) -> dict[str, Any]:
    inputs = {
        "prompt": "a boat",
        "model": "sora-2",
        "seconds": "8",
        "size": "1280x720",
        "seed": 3,
        "api_config": API,
    }
    return {**inputs, **changes}


def test_a_video_request_runs_in_the_video_pool_with_string_fields() -> None:
    request = OpenAIVideo().remote_request(**video_inputs())
    assert (request.provider, request.kind, request.files) == ("openai_videos", "video", ())
    assert request.body == {
        "model": "sora-2",
        "prompt": "a boat",
        "seconds": "8",
        "size": "1280x720",
    }
    again = OpenAIVideo().remote_request(**video_inputs(seed=4))
    assert again.body == request.body and again.request_hash != request.request_hash


def test_the_first_frame_is_fitted_to_the_video_size() -> None:
    frames = np.zeros((2, 300, 200, 3), dtype=np.float32)
    request = OpenAIVideo().remote_request(**video_inputs(image=frames, size="720x1280"))
    [(name, data)] = request.files
    reference = imaging.decode(data)[0]
    assert name == "input_reference" and reference.shape == (1, 1280, 720, 3)
