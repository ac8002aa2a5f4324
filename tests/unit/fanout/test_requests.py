"""What provider nodes send, and the hash that recognises the same job again."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from comfyfleet import imaging
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.nodes.providers.bfl.nodes import MODELS, BFLFluxImage, dimensions, flux_body
from comfyfleet.nodes.providers.openai_images.nodes import OpenAIImage, edit_files, openai_fields

API = ApiConfig("http://127.0.0.1:8299", "env:BFL_API_KEY")


def flux_inputs(**changes: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "prompt": "a red fox",
        "resolution": "1 MP",
        "aspect_ratio": "16:9",
        "grounding": False,
        "safety_tolerance": 2,
        "seed": 7,
        "model": "flux-2-pro",
        "api_config": API,
    }
    return {**inputs, **changes}


def test_the_hash_follows_inputs_seed_and_endpoint_but_not_timing() -> None:
    node = BFLFluxImage()
    first = node.remote_request(**flux_inputs()).request_hash
    assert node.remote_request(**flux_inputs()).request_hash == first
    assert node.remote_request(**flux_inputs(seed=8)).request_hash != first
    assert node.remote_request(**flux_inputs(prompt="a fox")).request_hash != first
    moved = ApiConfig("http://127.0.0.1:9999", API.key_ref)
    assert node.remote_request(**flux_inputs(api_config=moved)).request_hash != first
    slower = ApiConfig(API.base_url, API.key_ref, poll_interval=5, max_concurrency=2)
    assert node.remote_request(**flux_inputs(api_config=slower)).request_hash == first
    skipping = node.remote_request(**flux_inputs(skip_error=True))
    assert skipping.request_hash == first and skipping.skip_error


def test_the_seed_tells_jobs_apart_even_where_the_provider_has_none() -> None:
    node = OpenAIImage()
    inputs = {
        "prompt": "p",
        "model": "gpt-image-1",
        "size": "auto",
        "quality": "auto",
        "response_format": "auto",
        "seed": 1,
        "api_config": API,
    }
    request = node.remote_request(**inputs)
    assert "seed" not in request.body
    assert request.body == {"model": "gpt-image-1", "prompt": "p", "n": 1}
    assert node.remote_request(**{**inputs, "seed": 2}).request_hash != request.request_hash


def test_dimensions_keep_the_ratio_in_steps_of_32() -> None:
    assert dimensions(1.0, "1:1") == (1024, 1024)
    width, height = dimensions(1.0, "16:9")
    assert width % 32 == 0 and height % 32 == 0 and abs(width / height - 16 / 9) < 0.05
    assert dimensions(4.0, "21:9") == (2048, 864)  # shrunk to fit, same ratio


def test_flux_body_for_each_kind_of_model() -> None:
    pro = flux_body(flux_inputs(), MODELS["flux-2-pro"])
    assert pro["width"] == 1376 and pro["height"] == 768 and "aspect_ratio" not in pro
    assert (pro["seed"], pro["safety_tolerance"], pro["output_format"]) == (7, 2, "png")
    kontext = flux_body(flux_inputs(), MODELS["flux-kontext-pro"])
    assert kontext["aspect_ratio"] == "16:9" and "width" not in kontext
    matched = flux_body(flux_inputs(aspect_ratio="match_input_image"), MODELS["flux-2-pro"])
    assert "width" not in matched and "aspect_ratio" not in matched


def test_reference_images_are_sent_as_png_in_order() -> None:
    red, blue = imaging.blank(1, 4, 4, 0xFF0000), imaging.blank(1, 4, 4, 0x0000FF)
    body = flux_body(flux_inputs(image1=red, image3=blue), MODELS["flux-2-pro"])
    assert set(body) >= {"input_image", "input_image_2"} and "input_image_3" not in body
    decoded = imaging.decode(base64.b64decode(body["input_image_2"]))[0]
    assert np.allclose(decoded, blue)
    with pytest.raises(ValueError, match="at most 1 reference"):
        flux_body(flux_inputs(image1=red, image2=blue), MODELS["flux-pro-1.1"])


def test_grounding_is_asked_only_of_models_that_offer_it() -> None:
    assert flux_body(flux_inputs(grounding=True), MODELS["flux-2-max"])["grounding"] is True
    with pytest.raises(ValueError, match="grounding is only offered by flux-2-max"):
        flux_body(flux_inputs(grounding=True), MODELS["flux-2-pro"])


def test_openai_edit_uploads_every_frame_and_an_alpha_mask() -> None:
    fields = openai_fields(
        {
            "model": "m",
            "prompt": "p",
            "size": "1024x1024",
            "quality": "auto",
            "response_format": "url",
        }
    )
    assert fields == {
        "model": "m",
        "prompt": "p",
        "n": 1,
        "size": "1024x1024",
        "response_format": "url",
    }
    images = imaging.blank(2, 4, 4, 0x00FF00)
    mask = np.zeros((1, 4, 4), dtype=np.float32)
    mask[0, 0, 0] = 1.0
    files = edit_files(images, mask)
    assert [name for name, _ in files] == ["image_0.png", "image_1.png", "mask"]
    alpha = imaging.decode(files[-1][1])[1]  # MASK is 1 - alpha
    assert alpha[0, 0, 0] == 1.0 and alpha[0, 1, 1] == 0.0


def test_a_request_never_shows_more_than_its_hash() -> None:
    request = RemoteRequest("bfl", "flux-2-pro", API, {"prompt": "x"})
    assert repr(request) == f"RemoteRequest(bfl/flux-2-pro, {request.request_hash[:12]})"
    typed = ApiConfig("https://api.example/v1?key=QUERYSECRET", "env:K")
    assert "QUERYSECRET" not in repr(typed)


def test_a_flux_request_names_the_size_it_asks_for_outside_its_hash() -> None:
    node = BFLFluxImage()
    request = node.remote_request(**flux_inputs(resolution="0.25 MP", aspect_ratio="1:1"))
    assert request.result_size == (512, 512)
    assert (request.body["width"], request.body["height"]) == request.result_size
    # A model that takes an aspect ratio leaves the size to the provider.
    kontext = node.remote_request(**flux_inputs(model="flux-kontext-pro"))
    assert kontext.result_size is None
