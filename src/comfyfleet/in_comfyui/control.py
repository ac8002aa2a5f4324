"""A ComfyUI prompt as comfyfleet's nodes see it: its interrupt flag, its text, its progress.

comfyfleet's nodes run on the fan-out loop's thread, ComfyUI's prompt on its own
event loop: reports are posted to the prompt's loop, and the interrupt is read
from ComfyUI's flag while this prompt is the one running, and from its history
once it has ended (the flag is global and reset when the next prompt starts, which
may be before the watch looks). Once seen it is latched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from comfyfleet.engine.context import Preview
from comfyfleet.in_comfyui.comfyui import ENDED, INTERRUPTED, ComfyUI


class PromptControl:
    def __init__(self, prompt_id: str, comfy: ComfyUI, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt_id = prompt_id
        self.loop = loop  # the prompt's own loop (ComfyUI runs one per prompt)
        self._comfy = comfy
        self._interrupted = threading.Event()
        self._ended = False  # ended, and not interrupted: nothing more to look at

    @property
    def interrupted(self) -> bool:
        if not self._interrupted.is_set() and self.interrupt_seen():
            self._interrupted.set()
        return self._interrupted.is_set()

    @property
    def stopping(self) -> bool:
        return self.interrupted  # ComfyUI holds no prompt back

    def interrupt_seen(self) -> bool:
        """ComfyUI's flag is up while this prompt runs, or its history says interrupted."""
        comfy = self._comfy
        if self._ended:
            return False
        if comfy.running_prompt() == self.prompt_id:
            return comfy.interrupted()
        outcome = comfy.ended(self.prompt_id)
        self._ended = outcome == ENDED
        return outcome == INTERRUPTED

    def latch(self) -> None:
        self._interrupted.set()

    def report_progress(
        self, node_id: str, value: float, total: float, preview: Preview | None
    ) -> None:
        self._post(self._comfy.progress, self.prompt_id, node_id, value, total)

    def send_text(self, node_id: str, text: str) -> None:
        self._post(self._comfy.send_text, self.prompt_id, node_id, text)

    def _post(self, call: Callable[..., None], *args: Any) -> None:
        # A closed loop raises RuntimeError: the prompt has ended, nobody is listening.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(call, *args)
