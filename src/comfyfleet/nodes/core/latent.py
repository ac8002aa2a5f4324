"""SaveLatent: a LATENT value written into the output folder as ComfyUI writes it (a
`.latent` file, latents.py), so ComfyUI's LoadLatent reads it back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from comfyfleet import latents
from comfyfleet.folders import current_folders
from comfyfleet.nodes.core.saving import SaveTarget, format_prefix


class SaveLatent:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "samples": ("LATENT",),
                "filename_prefix": ("STRING", {"default": "latents/ComfyUI"}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "_for_testing"

    async def save(
        self,
        samples: Any,
        filename_prefix: str = "ComfyUI",
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> dict[str, Any]:
        # As ComfyUI's: the prompt (and each extra key) as JSON text in the file's metadata.
        metadata = {"prompt": json.dumps(prompt) if prompt is not None else ""}
        if isinstance(extra_pnginfo, dict):
            metadata.update({str(k): json.dumps(v) for k, v in extra_pnginfo.items()})
        data = await asyncio.to_thread(latents.encode, samples, metadata)
        # ComfyUI names latents without a size: %width% and %height% are 0.
        prefix = format_prefix(filename_prefix, width=0, height=0, prompt=prompt)
        target = SaveTarget.resolve(current_folders().output, prefix)
        filename, _ = await asyncio.to_thread(
            target.write_new, target.name, target.next_counter(), data, "latent"
        )
        saved = {"filename": filename, "subfolder": target.subfolder, "type": "output"}
        return {"ui": {"latents": [saved]}}


NODE_CLASS_MAPPINGS: dict[str, type] = {"SaveLatent": SaveLatent}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {"SaveLatent": "SaveLatent"}
PYTHON_MODULES = dict.fromkeys(NODE_CLASS_MAPPINGS, "nodes")
