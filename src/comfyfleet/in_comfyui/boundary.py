"""Values crossing between ComfyUI and comfyfleet's nodes, the one place they change form.

ComfyUI passes IMAGE and MASK values as torch tensors ([batch, height, width,
channels] float32 in 0..1), and LATENT values as dicts holding tensors;
comfyfleet's nodes take and return numpy arrays of the same shape and range
(in dicts alike). A VIDEO result goes out as ComfyUI's own video value
(`VideoFromFile` on the same file), which ComfyUI's video nodes take (Save Video,
Get Video Components); no node of comfyfleet's that ComfyUI shows takes a VIDEO.
Everything else (tasks, API settings, strings) passes through unchanged, except
comfyfleet's ExecutionBlocker, which ComfyUI only honours as its own class. The
torch part is two calls (`is_tensor`, `from_numpy`) on whatever module is given,
so the rest is the same code with or without torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from comfyfleet.engine.blocker import is_blocker
from comfyfleet.fanout.video import VideoFile


class TensorModule(Protocol):
    """What is used of `torch`."""

    def is_tensor(self, value: Any) -> bool: ...

    def from_numpy(self, array: Any) -> Any: ...


@dataclass(frozen=True)
class Boundary:
    tensors: TensorModule
    #: ComfyUI's ExecutionBlocker class (`comfy_execution.graph.ExecutionBlocker`).
    blocker: Callable[[str | None], Any]
    #: ComfyUI's VideoFromFile (`comfy_api.input_impl`), None in a ComfyUI without it
    #: (VIDEO values then pass unchanged).
    video: Callable[[str], Any] | None = None
    #: The comfyfleet value behind each video handed to ComfyUI: its file is deleted
    #: when the value is released, so it lives as long as ComfyUI's value does.
    _behind: weakref.WeakKeyDictionary[Any, VideoFile] = field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False
    )

    def to_array(self, value: Any) -> Any:
        """A ComfyUI value as comfyfleet's nodes take it (lists and tuples item by item)."""
        if self.tensors.is_tensor(value):
            array = value.detach().cpu().float().numpy()
            return np.ascontiguousarray(array, dtype=np.float32)
        if isinstance(value, list | tuple):
            return type(value)(self.to_array(item) for item in value)
        if isinstance(value, dict):  # a LATENT: its tensors, one level down (a prompt: as is)
            return {
                k: self.to_array(v) if self.tensors.is_tensor(v) else v for k, v in value.items()
            }
        return value

    def to_comfy(self, value: Any) -> Any:
        """A comfyfleet output as ComfyUI's nodes take it (lists item by item)."""
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return self.tensors.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
        if is_blocker(value) and not isinstance(value, self._blocker_class()):
            return self.blocker(value.message)
        if isinstance(value, VideoFile) and self.video is not None:
            video = self.video(str(value.path))
            self._behind[video] = value
            return video
        if isinstance(value, list):
            return [self.to_comfy(item) for item in value]
        if isinstance(value, dict):  # a LATENT: its arrays, one level down
            return {
                k: self.to_comfy(v) if isinstance(v, np.ndarray) else v for k, v in value.items()
            }
        return value

    def result(self, returned: Any) -> Any:
        """A node function's return value (a tuple of outputs, or ComfyUI's dict of `ui`
        and `result`) with every output converted; `ui` is JSON and stays."""
        if isinstance(returned, dict):
            converted = dict(returned)
            if "result" in converted:
                converted["result"] = tuple(self.to_comfy(v) for v in converted["result"])
            return converted
        if isinstance(returned, tuple | list):
            return tuple(self.to_comfy(value) for value in returned)
        return returned

    def _blocker_class(self) -> type:
        blocker = self.blocker
        return blocker if isinstance(blocker, type) else type(None)
