"""The `testing` pack: nodes that sleep, fail or report progress on demand.

Loaded only when asked for. `TestSleep` and `TestSyncError` have exactly the
interface of the ComfyUI test-pack nodes of the same names, so recorded ComfyUI
sessions can be replayed against this server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from PIL import Image

from comfyfleet.engine.context import ProgressBar

ANY = "*"
TESTING = "_for_testing"
# How often `Sleep` reports progress: 20 times a second, about what a sampler sends (one
# report per step). TestSleep reports every 10 ms, as ComfyUI's does.
_SLEEP_REPORT_EVERY = 0.05
_TEST_SLEEP_REPORT_EVERY = 0.01


async def _sleep_with_progress(seconds: float, unique_id: str | None, every: float) -> None:
    """Sleep, reporting elapsed time every `every` seconds and at the end. It wakes only
    to report: an interrupt cancels the node's task (and a report raises when the prompt
    is interrupted)."""
    if seconds <= 0:
        return
    bar = ProgressBar(seconds, node_id=unique_id)
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        bar.update_absolute(min(elapsed, seconds))
        if elapsed >= seconds:
            return
        await asyncio.sleep(min(every, seconds - elapsed))


class Sleep:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "value": (ANY, {}),
                "seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 3600.0, "step": 0.01}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = (ANY,)
    FUNCTION = "sleep"
    CATEGORY = TESTING
    DESCRIPTION = "Passes value through after sleeping, reporting progress; interruptible."

    async def sleep(self, value: Any, seconds: float, unique_id: str | None = None) -> tuple[Any]:
        await _sleep_with_progress(seconds, unique_id, _SLEEP_REPORT_EVERY)
        return (value,)


#: What `Fail` can raise: a node's own error, or the machine running out of memory.
FAILURES: dict[str, type[Exception]] = {"RuntimeError": RuntimeError, "MemoryError": MemoryError}


class Fail:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"message": ("STRING", {"default": "Intentional failure"})},
            "optional": {"value": (ANY, {}), "error": (list(FAILURES),)},
        }

    RETURN_TYPES = (ANY,)
    FUNCTION = "fail"
    CATEGORY = TESTING
    DESCRIPTION = "Raises RuntimeError(message) (or the `error` chosen)."

    def fail(self, message: str, value: Any = None, error: str = "RuntimeError") -> tuple[Any]:
        raise FAILURES[error](message)


class Progress:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "value": (ANY, {}),
                "steps": ("INT", {"default": 10, "min": 1, "max": 10000}),
                "seconds_per_step": (
                    "FLOAT",
                    {"default": 0.0, "min": 0.0, "max": 60.0, "step": 0.01},
                ),
            },
            "optional": {"previews": ("BOOLEAN", {"default": False})},
        }

    RETURN_TYPES = (ANY,)
    FUNCTION = "run"
    CATEGORY = TESTING
    DESCRIPTION = (
        "Passes value through after reporting `steps` progress steps (blocking); with "
        "`previews`, each step carries a tiny preview image, as a sampler's do."
    )

    def run(
        self, value: Any, steps: int, seconds_per_step: float, previews: bool = False
    ) -> tuple[Any]:
        bar = ProgressBar(steps)
        for step in range(1, steps + 1):
            if seconds_per_step > 0:
                time.sleep(seconds_per_step)
            image = Image.new("RGB", (8, 8), (step % 256, 0, 0)) if previews else None
            bar.update_absolute(step, steps, None if image is None else ("JPEG", image, None))
        return (value,)


class TestSleep:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "value": (ANY, {}),
                "seconds": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 9999.0,
                        "step": 0.01,
                        "tooltip": "The amount of seconds to sleep.",
                    },
                ),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = (ANY,)
    FUNCTION = "sleep"
    CATEGORY = TESTING

    async def sleep(self, value: Any, seconds: float, unique_id: str | None = None) -> tuple[Any]:
        await _sleep_with_progress(seconds, unique_id, _TEST_SLEEP_REPORT_EVERY)
        return (value,)


class TestSyncError:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": (ANY, {})}}

    RETURN_TYPES = (ANY,)
    FUNCTION = "sync_error"
    CATEGORY = "_for_testing/async"

    def sync_error(self, value: Any) -> tuple[Any]:
        raise RuntimeError("Intentional sync execution error for testing")


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "Sleep": Sleep,
    "Fail": Fail,
    "Progress": Progress,
    "TestSleep": TestSleep,
    "TestSyncError": TestSyncError,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "Sleep": "Sleep",
    "Fail": "Fail",
    "Progress": "Progress",
    "TestSleep": "Test Sleep",
    "TestSyncError": "Test Sync Error",
}
