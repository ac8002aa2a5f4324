"""OpenAI-compatible videos API (Sora): the client, its fan-out driver, and the video node."""

from comfyfleet.nodes.providers.openai_videos.driver import OpenAIVideosDriver
from comfyfleet.nodes.providers.openai_videos.nodes import OpenAIVideo

DRIVER = OpenAIVideosDriver()
NODE_CLASS_MAPPINGS: dict[str, type] = {"OpenAIVideo": OpenAIVideo}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {
    "OpenAIVideo": "OpenAI-compatible Video (Sora)"
}
