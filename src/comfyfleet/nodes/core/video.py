"""SaveVideo: a VIDEO value's file copied into the output folder, as ComfyUI names it."""

from __future__ import annotations

from typing import Any

from comfyfleet.fanout.video import VideoFile
from comfyfleet.folders import current_folders
from comfyfleet.nodes.core.saving import SaveTarget, format_prefix

FORMATS = ["auto", "mp4"]
CODECS = ["auto", "h264"]


class SaveVideo:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video to save."}),
                "filename_prefix": (
                    "STRING",
                    {
                        "default": "video/ComfyUI",
                        "tooltip": "The prefix for the file to save. This may include "
                        "formatting information such as %date:yyyy-MM-dd%.",
                    },
                ),
                "format": (FORMATS, {"default": "auto", "tooltip": "The container."}),
                "codec": (CODECS, {"default": "auto", "tooltip": "The codec."}),
            },
            "hidden": {"prompt": "PROMPT"},
        }

    RETURN_TYPES = ()
    FUNCTION = "save_video"
    OUTPUT_NODE = True
    CATEGORY = "image/video"
    DESCRIPTION = "Saves the input video to your ComfyUI output directory."

    def save_video(
        self,
        video: Any,
        filename_prefix: str = "video/ComfyUI",
        format: str = "auto",
        codec: str = "auto",
        prompt: Any = None,
    ) -> dict[str, Any]:
        if not isinstance(video, VideoFile):
            raise TypeError(f"video is a {type(video).__name__}, not a video file")
        # The file is copied as it is: nothing here re-encodes.
        if format != "auto" and video.format != format:
            raise ValueError(f"the video is {video.format}; it cannot be saved as {format}")
        root = current_folders().output
        width, height = video.get_dimensions()
        prefix = format_prefix(filename_prefix, width=width, height=height, prompt=prompt)
        target = SaveTarget.resolve(root, prefix)
        data = video.path.read_bytes()
        filename, _ = target.write_new(target.name, target.next_counter(), data, video.format)
        saved = {"filename": filename, "subfolder": target.subfolder, "type": "output"}
        return {"ui": {"images": [saved], "animated": [True]}}


NODE_CLASS_MAPPINGS: dict[str, type] = {"SaveVideo": SaveVideo}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {"SaveVideo": "Save Video"}
PYTHON_MODULES = dict.fromkeys(NODE_CLASS_MAPPINGS, "comfy_extras.nodes_video")
