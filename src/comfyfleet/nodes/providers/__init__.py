"""The providers pack: API settings, FLUX (BFL API) and OpenAI-compatible image nodes.

Each provider node waits for its job; its "Concurrent Submit" twin (minted at
start-up, see `nodes.fanout`) sends the same job and returns a task at once.
Both go through the fan-out service's pools and journal.
"""

from __future__ import annotations

from comfyfleet.nodes.providers.flux import BFLFluxImage
from comfyfleet.nodes.providers.openai import OpenAIImage
from comfyfleet.nodes.providers.settings import APISettings

NODE_CLASS_MAPPINGS: dict[str, type] = {
    "APISettings": APISettings,
    "BFLFluxImage": BFLFluxImage,
    "OpenAIImage": OpenAIImage,
}

NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {
    "APISettings": "API Settings",
    "BFLFluxImage": "FLUX Image (BFL API)",
    "OpenAIImage": "OpenAI-compatible Image",
}
