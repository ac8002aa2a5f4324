"""The `testing` pack: nodes that sleep, fail or report progress on demand, one whose
side effect is counted outside the process (`LedgerAppend`), and seeded latents and
clips (for what carries LATENT and VIDEO values between processes).

Loaded only when asked for. `TestSleep` and `TestSyncError` have exactly the
interface of the ComfyUI test-pack nodes of the same names, so recorded ComfyUI
sessions can be replayed against this server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import numpy as np
from PIL import Image

from comfyfleet.engine.context import ProgressBar, current_node
from comfyfleet.fanout.solid_mp4 import solid_mp4
from comfyfleet.fanout.video import video_from_bytes
from comfyfleet.logs import JOB
from comfyfleet.testing import LEDGER_ENV

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


class Work:
    """Busy for `seconds` of this thread's CPU time, reporting nothing: unlike a sleep,
    a paused process (SIGSTOP) does not get through any of it while paused."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "value": (ANY, {}),
                "seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 60.0, "step": 0.01}),
            }
        }

    RETURN_TYPES = (ANY,)
    FUNCTION = "work"
    CATEGORY = TESTING
    DESCRIPTION = "Passes value through after `seconds` of CPU time, reporting no progress."

    def work(self, value: Any, seconds: float) -> tuple[Any]:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            sum(range(1000))
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


#: Bytes of a run's token, carried in its image's first pixels.
TOKEN_BYTES = 16


def token_image(token: bytes) -> Any:
    """An 8x8 image whose first bytes (row by row, R G B) are `token`: saved to 8 bits
    (truncated, as SaveImage does) they come back exactly."""
    pixels = np.zeros(8 * 8 * 3, dtype=np.float32)
    pixels[: len(token)] = np.frombuffer(token, dtype=np.uint8)
    return ((pixels + np.float32(0.5)) / np.float32(255.0)).reshape(1, 8, 8, 3)


class LedgerAppend:
    """A side effect that can be counted from outside: after `seconds`, one line is
    appended (a single `write`, so a killed process leaves a whole line or none) to the
    file `COMFYFLEET_TEST_LEDGER` names. The line says which run it was: the prompt, the
    attempt and lane of the job this process runs it for, the process, the time just
    before the write, and a random token that the image returned also carries (saved by
    SaveImage, it tells which run wrote a file). Never cached: each run appends."""

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
    CATEGORY = TESTING
    DESCRIPTION = (
        f"After `seconds`, appends one line naming this run to the file ${LEDGER_ENV} "
        "names; the image carries the run's token."
    )

    @classmethod
    def IS_CHANGED(cls, **_: Any) -> float:
        return float("nan")  # every run is a run of its own

    async def append(self, tag: str, seconds: float, unique_id: str | None = None) -> tuple[Any]:
        path = os.environ.get(LEDGER_ENV)
        if not path:
            raise RuntimeError(f"LedgerAppend needs {LEDGER_ENV}: the file its lines go to")
        await _sleep_with_progress(seconds, unique_id, _SLEEP_REPORT_EVERY)
        node, job = current_node(), JOB.get()
        token = os.urandom(TOKEN_BYTES)
        line = {
            "prompt_id": None if node is None else node.prompt_id,
            "node": unique_id,
            "tag": tag,
            "attempt": None if job is None else job.attempt,
            "lane": None if job is None else job.lane,
            "pid": os.getpid(),
            "token": token.hex(),
        }
        await asyncio.to_thread(_append, path, line)
        return (token_image(token),)


def _append(path: str, line: dict[str, Any]) -> None:
    """One line, timed just before the one `write` that appends it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        line["time"] = time.time()
        os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


class SeededLatent:
    """A latent of normal noise drawn from `seed` (the same seed, the same latent): what a
    sampler makes, without one."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        side = {"default": 64, "min": 8, "max": 4096, "step": 8}
        return {
            "required": {
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**64 - 1}),
                "width": ("INT", side),
                "height": ("INT", dict(side)),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64}),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = TESTING

    def make(self, seed: int, width: int, height: int, batch_size: int) -> tuple[Any]:
        noise = np.random.default_rng(seed).standard_normal(
            (batch_size, 4, height // 8, width // 8), dtype=np.float32
        )
        return ({"samples": noise},)


class SeededClip:
    """A short clip of one colour, its red, green and blue the low three bytes of `seed`:
    a VIDEO whose maker can be told from its frames."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**64 - 1})}}

    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "make"
    CATEGORY = TESTING

    def make(self, seed: int) -> tuple[Any]:
        rgb = ((seed >> 16) & 255, (seed >> 8) & 255, seed & 255)
        return (video_from_bytes(solid_mp4(64, 64, rgb, CLIP_FRAMES, CLIP_FPS)),)


CLIP_FRAMES, CLIP_FPS = 4, 8.0

NODE_CLASS_MAPPINGS: dict[str, type] = {
    "Sleep": Sleep,
    "Work": Work,
    "Fail": Fail,
    "Progress": Progress,
    "TestSleep": TestSleep,
    "TestSyncError": TestSyncError,
    "LedgerAppend": LedgerAppend,
    "SeededLatent": SeededLatent,
    "SeededClip": SeededClip,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "Sleep": "Sleep",
    "Work": "Work",
    "Fail": "Fail",
    "Progress": "Progress",
    "TestSleep": "Test Sleep",
    "TestSyncError": "Test Sync Error",
    "LedgerAppend": "Ledger Append",
    "SeededLatent": "Seeded Latent",
    "SeededClip": "Seeded Clip",
}
