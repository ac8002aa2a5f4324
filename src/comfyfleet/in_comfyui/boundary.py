"""Values crossing between ComfyUI and comfyfleet's nodes, the one place they change form.

ComfyUI passes IMAGE and MASK values as torch tensors ([batch, height, width,
channels] float32 in 0..1); comfyfleet's nodes take and return numpy arrays of
the same shape and range. Everything else (tasks, API settings, strings) passes
through unchanged, except comfyfleet's ExecutionBlocker, which ComfyUI only
honours as its own class. The torch part is two calls (`is_tensor`, `from_numpy`)
on whatever module is given, so the rest is the same code with or without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from comfyfleet.engine.blocker import is_blocker


class TensorModule(Protocol):
    """What is used of `torch`."""

    def is_tensor(self, value: Any) -> bool: ...

    def from_numpy(self, array: Any) -> Any: ...


@dataclass(frozen=True)
class Boundary:
    tensors: TensorModule
    #: ComfyUI's ExecutionBlocker class (`comfy_execution.graph.ExecutionBlocker`).
    blocker: Callable[[str | None], Any]

    def to_array(self, value: Any) -> Any:
        """A ComfyUI value as comfyfleet's nodes take it (lists and tuples item by item)."""
        if self.tensors.is_tensor(value):
            array = value.detach().cpu().float().numpy()
            return np.ascontiguousarray(array, dtype=np.float32)
        if isinstance(value, list | tuple):
            return type(value)(self.to_array(item) for item in value)
        return value

    def to_comfy(self, value: Any) -> Any:
        """A comfyfleet output as ComfyUI's nodes take it (lists item by item)."""
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return self.tensors.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
        if is_blocker(value) and not isinstance(value, self._blocker_class()):
            return self.blocker(value.message)
        if isinstance(value, list):
            return [self.to_comfy(item) for item in value]
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
