"""Images from an OpenAI-compatible API: generations, or edits when an image is given."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.nodes.providers.common import (
    API_CONFIG,
    build_request,
    failure_epoch,
    run_now,
    seed_input,
    skip_error_input,
)
from comfyfleet.spend.prices import PaidJobSpec

# 512x512 and 256x256 are the older models' (dall-e-2) sizes.
SIZES = [
    "auto",
    "1024x1024",
    "1536x1024",
    "1024x1536",
    "1792x1024",
    "1024x1792",
    "512x512",
    "256x256",
]
QUALITIES = ["auto", "high", "medium", "low", "hd", "standard"]
RESPONSE_FORMATS = ["auto", "b64_json", "url"]


def openai_fields(inputs: dict[str, Any]) -> dict[str, Any]:
    """The request fields; "auto" leaves a field out, so the provider's default applies.

    There is no seed field: this API has none, so the seed only tells jobs apart.
    """
    fields: dict[str, Any] = {"model": inputs["model"], "prompt": inputs["prompt"], "n": 1}
    for name in ("size", "quality", "response_format"):
        if inputs[name] != "auto":
            fields[name] = inputs[name]
    return fields


def edit_files(image: Any, mask: Any | None) -> tuple[tuple[str, bytes], ...]:
    """Every frame of `image` as an upload, and the mask as OpenAI reads one: the
    transparent part is edited (a ComfyUI MASK is 1 where to edit)."""
    frames = np.asarray(image)
    files = [(f"image_{n}.png", imaging.frame_png(frames, n)) for n in range(frames.shape[0])]
    if mask is not None:
        plane = np.asarray(mask, dtype=np.float32)
        plane = plane[0] if plane.ndim == 3 else plane
        rgba = np.zeros((1, *plane.shape, 4), dtype=np.float32)
        rgba[0, :, :, 3] = 1.0 - plane
        files.append(("mask", imaging.frame_png(rgba)))
    return tuple(files)


class OpenAIImage:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "model": ("STRING", {"default": "gpt-image-1"}),
                "size": (SIZES, {"default": "auto"}),
                "quality": (QUALITIES, {"default": "auto"}),
                "response_format": (RESPONSE_FORMATS, {"default": "auto"}),
                "seed": seed_input(),
                "api_config": (API_CONFIG, {}),
            },
            "optional": {
                "image": ("IMAGE", {"tooltip": "Given: an edit (/v1/images/edits)"}),
                "mask": ("MASK", {}),
                "skip_error": skip_error_input(),
            },
        }

    # What its jobs are priced by (budgets, the cost dry run); matches remote_request.
    PAID_JOB = PaidJobSpec("openai")
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "generate"
    CATEGORY = "api/image"
    DESCRIPTION = "An image from an OpenAI-compatible images API; waits for the result."

    @classmethod
    def IS_CHANGED(cls, **_inputs: Any) -> int:
        return failure_epoch()

    def remote_request(self, **inputs: Any) -> RemoteRequest:
        api: ApiConfig = inputs["api_config"]
        image = inputs.get("image")
        return RemoteRequest(
            provider="openai",
            operation="generations" if image is None else "edits",
            api=api,
            body=openai_fields(inputs),
            files=() if image is None else edit_files(image, inputs.get("mask")),
            skip_error=bool(inputs.get("skip_error", False)),
            seed=int(inputs["seed"]),
            node_class="OpenAIImage",
        )

    async def generate(self, **inputs: Any) -> tuple[imaging.ImageArray]:
        request = await build_request(self.remote_request, inputs)
        return (await run_now(request),)
