"""A stand-in for the parts of ComfyUI the fan-out pack uses (torch and ComfyUI are not in
comfyfleet's environment): tensors that wrap numpy arrays, ComfyUI's interrupt flag,
its executing context and its reports, and a prompt runner that, like ComfyUI, runs
each prompt in a fresh event loop on its own thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from comfyfleet.folders import Folders
from comfyfleet.in_comfyui.boundary import Boundary
from comfyfleet.in_comfyui.comfyui import ENDED, INTERRUPTED, ComfyUI, Executing


class Tensor:
    """torch.Tensor as far as the boundary uses it."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def detach(self) -> Tensor:
        return self

    def cpu(self) -> Tensor:
        return self

    def float(self) -> Tensor:
        return Tensor(np.asarray(self.array, dtype=np.float32))

    def numpy(self) -> Any:
        return self.array


class Torch:
    @staticmethod
    def is_tensor(value: Any) -> bool:
        return isinstance(value, Tensor)

    @staticmethod
    def from_numpy(array: Any) -> Tensor:
        return Tensor(array)


class Blocker:
    """comfy_execution.graph.ExecutionBlocker."""

    def __init__(self, message: str | None) -> None:
        self.message = message


class VideoFromFile:
    """comfy_api.input_impl.VideoFromFile, as far as it is made: from a path."""

    def __init__(self, file: str) -> None:
        self.file = file


class Interrupted(Exception):
    """comfy.model_management.InterruptProcessingException."""


class StandInComfyUI:
    def __init__(self, root: Path) -> None:
        self.interrupt = threading.Event()
        self.prompt_id: str | None = None
        self.texts: list[tuple[str, str, str]] = []
        self.progress: list[tuple[str, str, float, float]] = []
        self.history: dict[str, str] = {}  # prompt id -> how it ended
        self._executing: ContextVar[Executing | None] = ContextVar("executing", default=None)
        folders = Folders.under(root).ensure()
        self.comfy = ComfyUI(
            interrupted=self.interrupt.is_set,
            running_prompt=lambda: self.prompt_id,
            executing=self._executing.get,
            ended=self.history.get,
            send_text=lambda *args: self.texts.append(args),
            progress=lambda *args: self.progress.append(args),
            interrupt_error=Interrupted,
            boundary=Boundary(Torch(), Blocker, VideoFromFile),
            folders=folders,
            user_dir=root / "user",
            own_nodes=frozenset({"SaveImage", "ImageInvert"}),
        )

    async def run_prompt(
        self,
        prompt_id: str,
        body: Callable[[Callable[..., Awaitable[Any]]], Coroutine[Any, Any, Any]],
    ) -> Any:
        """Run `body(call)` as ComfyUI runs a prompt: a new loop on another thread, the
        interrupt flag reset at its start; `call(node_id, cls, **inputs)` runs one node."""

        async def call(node_id: str, cls: type[Any], **inputs: Any) -> Any:
            token = self._executing.set(Executing(prompt_id, node_id, None))
            try:
                return await getattr(cls(), cls.FUNCTION)(**inputs)
            finally:
                self._executing.reset(token)

        def thread() -> Any:
            self.interrupt.clear()
            self.prompt_id = prompt_id
            ended = ENDED
            try:
                return asyncio.run(body(call))
            except Interrupted:
                ended = INTERRUPTED
                raise
            finally:
                self.prompt_id = None
                self.history[prompt_id] = ended

        return await asyncio.to_thread(thread)
