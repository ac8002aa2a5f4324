"""Videos from an OpenAI-compatible videos API (Sora): a prompt, optionally a first frame."""

from __future__ import annotations

from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.fanout.video import VideoFile
from comfyfleet.nodes.providers.common import (
    API_CONFIG,
    build_request,
    failure_epoch,
    run_now,
    seed_input,
    skip_error_input,
)
from comfyfleet.nodes.providers.openai_videos.client import PROVIDER
from comfyfleet.spend.prices import PaidJobSpec

SECONDS = ["4", "8", "12"]
# 1920x1080 and 1080x1920 are sora-2-pro's only.
SIZES = ["720x1280", "1280x720", "1024x1792", "1792x1024", "1920x1080", "1080x1920"]


def video_fields(inputs: dict[str, Any]) -> dict[str, str]:
    """The form fields. There is no seed field: this API has none, so the seed only
    tells jobs apart."""
    return {
        "model": str(inputs["model"]),
        "prompt": str(inputs["prompt"]),
        "seconds": str(inputs["seconds"]),
        "size": str(inputs["size"]),
    }


def reference_png(image: Any, size: str) -> bytes:
    """The first frame of `image`, cropped and scaled to the video's size: the API takes a
    reference only at exactly that size."""
    width, _, height = size.partition("x")
    frame = np.asarray(image)[:1]
    fitted = imaging.resize(frame, int(width), int(height), "bilinear", crop="center")
    return imaging.frame_png(fitted)


class OpenAIVideo:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "model": ("STRING", {"default": "sora-2"}),
                "seconds": (SECONDS, {"default": "4"}),
                "size": (SIZES, {"default": "1280x720"}),
                "seed": seed_input(),
                "api_config": (API_CONFIG, {}),
            },
            "optional": {
                "image": ("IMAGE", {"tooltip": "The first frame (input_reference)"}),
                "skip_error": skip_error_input("a one-second white 512x512 clip"),
            },
        }

    # What its jobs are priced by (budgets, the cost dry run); matches remote_request.
    PAID_JOB = PaidJobSpec(PROVIDER, seconds_input="seconds")
    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "generate"
    CATEGORY = "api/video"
    DESCRIPTION = "A video from an OpenAI-compatible videos API (/v1/videos); waits for it."

    @classmethod
    def IS_CHANGED(cls, **_inputs: Any) -> int:
        return failure_epoch()

    def remote_request(self, **inputs: Any) -> RemoteRequest:
        """The job these inputs ask for (how the Concurrent Submit twin sends it too)."""
        api: ApiConfig = inputs["api_config"]
        image = inputs.get("image")
        files = (
            () if image is None else (("input_reference", reference_png(image, inputs["size"])),)
        )
        return RemoteRequest(
            provider=PROVIDER,
            operation="videos",
            api=api,
            body=video_fields(inputs),
            files=files,
            kind="video",
            skip_error=bool(inputs.get("skip_error", False)),
            seed=int(inputs["seed"]),
            node_class="OpenAIVideo",
        )

    async def generate(self, **inputs: Any) -> tuple[VideoFile]:
        request = await build_request(self.remote_request, inputs)
        return (await run_now(request),)
