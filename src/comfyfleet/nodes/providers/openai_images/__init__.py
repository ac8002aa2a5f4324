"""OpenAI-compatible images API: the client, its fan-out driver, and the image node."""

from comfyfleet.nodes.providers.openai_images.driver import OpenAIImagesDriver
from comfyfleet.nodes.providers.openai_images.nodes import OpenAIImage

DRIVER = OpenAIImagesDriver()
NODE_CLASS_MAPPINGS: dict[str, type] = {"OpenAIImage": OpenAIImage}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {"OpenAIImage": "OpenAI-compatible Image"}
