"""`LedgerAppend` for a real ComfyUI backend of the chaos suite: the interface and the
line of comfyfleet's testing-pack node (comfyfleet/nodes/testing.py), written in
ComfyUI's terms. ComfyUI has no attempt number to give: the line's `attempt` is null,
and the checker tells its runs apart by pid and time. Loaded by the ComfyUI the suite
starts (`custom_nodes` of its extra model paths); never by comfyfleet itself."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import torch

LEDGER_ENV = "COMFYFLEET_TEST_LEDGER"
TOKEN_BYTES = 16


def _prompt_id() -> str | None:
    try:  # ComfyUI's executing context (recent versions)
        from comfy_execution.utils import get_executing_context

        context = get_executing_context()
        if context is not None:
            return str(context.prompt_id)
    except ImportError:
        pass
    from server import PromptServer

    last = getattr(PromptServer.instance, "last_prompt_id", None)
    return None if last is None else str(last)


class LedgerAppend:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "tag": ("STRING", {"default": ""}),
                "seconds": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 3600.0, "step": 0.01}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "append"
    CATEGORY = "_for_testing"

    @classmethod
    def IS_CHANGED(cls, **_: Any) -> float:
        return float("nan")

    def append(self, tag: str, seconds: float, unique_id: str | None = None) -> tuple[Any]:
        import comfy.model_management

        path = os.environ.get(LEDGER_ENV)
        if not path:
            raise RuntimeError(f"LedgerAppend needs {LEDGER_ENV}: the file its lines go to")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            comfy.model_management.throw_exception_if_processing_interrupted()
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        token = os.urandom(TOKEN_BYTES)
        line = {
            "prompt_id": _prompt_id(),
            "node": unique_id,
            "tag": tag,
            "attempt": None,
            "lane": "comfyui",
            "pid": os.getpid(),
            "token": token.hex(),
        }
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            line["time"] = time.time()
            os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)
        pixels = np.zeros(8 * 8 * 3, dtype=np.float32)
        pixels[:TOKEN_BYTES] = np.frombuffer(token, dtype=np.uint8)
        image = ((pixels + 0.5) / 255.0).reshape(1, 8, 8, 3)
        return (torch.from_numpy(image),)


NODE_CLASS_MAPPINGS = {"LedgerAppend": LedgerAppend}
NODE_DISPLAY_NAME_MAPPINGS = {"LedgerAppend": "Ledger Append"}
