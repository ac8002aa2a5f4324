"""FLUX through the Black Forest Labs API (or a relay speaking it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from comfyfleet import imaging
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.nodes.providers.common import (
    API_CONFIG,
    build_request,
    failure_epoch,
    png_base64,
    run_now,
    seed_input,
    skip_error_input,
)
from comfyfleet.spend.prices import PaidJobSpec

REFERENCE_SLOTS = 10
# "0.0625 MP" is 256x256 at 1:1, the smallest side the dimension models accept.
RESOLUTIONS = {
    "1 MP": 1.0,
    "0.0625 MP": 0.0625,
    "0.25 MP": 0.25,
    "0.5 MP": 0.5,
    "2 MP": 2.0,
    "4 MP": 4.0,
}
ASPECT_RATIOS = ["1:1", "16:9", "9:16", "4:3", "3:4", "3:2", "2:3", "21:9", "9:21"]
MATCH_INPUT = "match_input_image"
# Every model accepts sides that are multiples of 32 within these bounds.
_SIDE_STEP, _SIDE_MIN, _SIDE_MAX = 32, 256, 2048
_MEGAPIXEL = 1024 * 1024


def _references(count: int) -> tuple[str, ...]:
    return ("input_image", *(f"input_image_{n}" for n in range(2, count + 1)))


@dataclass(frozen=True)
class FluxModel:
    size: str  # "dimensions" (width/height) or "aspect_ratio"
    references: tuple[str, ...]  # body fields for image1, image2, ...
    grounding: bool = False  # web-search grounding (FLUX.2 [max])


MODELS: dict[str, FluxModel] = {
    "flux-2-pro": FluxModel("dimensions", _references(REFERENCE_SLOTS)),
    "flux-2-max": FluxModel("dimensions", _references(REFERENCE_SLOTS), grounding=True),
    "flux-2-flex": FluxModel("dimensions", _references(REFERENCE_SLOTS)),
    "flux-kontext-pro": FluxModel("aspect_ratio", _references(4)),
    "flux-kontext-max": FluxModel("aspect_ratio", _references(4)),
    "flux-pro-1.1": FluxModel("dimensions", ("image_prompt",)),
    "flux-pro-1.1-ultra": FluxModel("aspect_ratio", ("image_prompt",)),
    "flux-dev": FluxModel("dimensions", ()),
}


def dimensions(megapixels: float, aspect_ratio: str) -> tuple[int, int]:
    """Width and height near `megapixels` (of 1024 x 1024) with the ratio "W:H", in steps
    of 32; a side past the largest allowed shrinks both, keeping the ratio."""
    across, down = (float(part) for part in aspect_ratio.split(":"))
    width = math.sqrt(megapixels * _MEGAPIXEL * across / down)
    height = width * down / across
    scale = min(1.0, _SIDE_MAX / max(width, height))

    def side(value: float) -> int:
        stepped = round(value * scale / _SIDE_STEP) * _SIDE_STEP
        return max(_SIDE_MIN, min(_SIDE_MAX, stepped))

    return side(width), side(height)


def flux_body(inputs: dict[str, Any], model: FluxModel) -> dict[str, Any]:
    """The JSON the model's endpoint takes, from the node's inputs."""
    body: dict[str, Any] = {
        "prompt": inputs["prompt"],
        "seed": int(inputs["seed"]),
        "safety_tolerance": int(inputs["safety_tolerance"]),
        "output_format": "png",
    }
    ratio = inputs["aspect_ratio"]
    if ratio != MATCH_INPUT:
        if model.size == "dimensions":
            body["width"], body["height"] = dimensions(RESOLUTIONS[inputs["resolution"]], ratio)
        else:
            body["aspect_ratio"] = ratio
    if inputs.get("grounding"):
        if not model.grounding:
            raise ValueError("grounding is only offered by " + ", ".join(_grounded()))
        body["grounding"] = True
    images = [inputs.get(f"image{n}") for n in range(1, REFERENCE_SLOTS + 1)]
    connected = [image for image in images if image is not None]
    if len(connected) > len(model.references):
        raise ValueError(f"this model takes at most {len(model.references)} reference image(s)")
    for field, image in zip(model.references, connected):
        body[field] = png_base64(image)
    return body


def _grounded() -> list[str]:
    return [name for name, model in MODELS.items() if model.grounding]


class BFLFluxImage:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        optional: dict[str, Any] = {
            f"image{n}": ("IMAGE", {"tooltip": "Reference image"})
            for n in range(1, REFERENCE_SLOTS + 1)
        }
        optional["skip_error"] = skip_error_input()
        return {
            "required": {
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "resolution": (list(RESOLUTIONS), {"default": "1 MP"}),
                "aspect_ratio": ([*ASPECT_RATIOS, MATCH_INPUT], {"default": "1:1"}),
                "grounding": ("BOOLEAN", {"default": False}),
                "safety_tolerance": ("INT", {"default": 2, "min": 0, "max": 6}),
                "seed": seed_input(),
                "model": (list(MODELS), {"default": "flux-2-pro"}),
                "api_config": (API_CONFIG, {}),
            },
            "optional": optional,
        }

    # What its jobs are priced by (budgets, the cost dry run); matches remote_request.
    PAID_JOB = PaidJobSpec("bfl")
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "generate"
    CATEGORY = "api/image"
    DESCRIPTION = "An image from a FLUX model through the BFL API; waits for the result."

    @classmethod
    def IS_CHANGED(cls, **_inputs: Any) -> int:
        return failure_epoch()

    def remote_request(self, **inputs: Any) -> RemoteRequest:
        """The job these inputs ask for (how the Concurrent Submit twin sends it too)."""
        name = inputs["model"]
        api: ApiConfig = inputs["api_config"]
        body = flux_body(inputs, MODELS[name])
        size = (body["width"], body["height"]) if "width" in body else None
        return RemoteRequest(
            provider="bfl",
            operation=name,
            api=api,
            body=body,
            skip_error=bool(inputs.get("skip_error", False)),
            seed=int(inputs["seed"]),
            node_class="BFLFluxImage",
            result_size=size,
        )

    async def generate(self, **inputs: Any) -> tuple[imaging.ImageArray]:
        request = await build_request(self.remote_request, inputs)
        return (await run_now(request),)
