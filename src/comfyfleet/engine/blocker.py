"""ExecutionBlocker: a value that stops every node it reaches from running."""

from __future__ import annotations

from typing import Any, Protocol, TypeGuard


class Blocker(Protocol):
    """What the engine reads of a blocker: its message (None: silent)."""

    message: str | None


class ExecutionBlocker:
    """Returned in place of an output; downstream nodes are skipped, not failed.

    With a message, the first node it blocks reports an `execution_error` event
    carrying that message (ComfyUI's behaviour); without one it is silent.
    """

    def __init__(self, message: str | None) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ExecutionBlocker({self.message!r})"


def is_blocker(value: Any) -> TypeGuard[Blocker]:
    """This engine's blocker or a node pack's own: ComfyUI's packs return
    `comfy_execution.graph.ExecutionBlocker`, and some carry a copy of that class.

    Recognised by class name and a `message`, not by importing ComfyUI's class: that
    import pulls in ComfyUI (and torch) and still misses the copies.
    """
    if isinstance(value, ExecutionBlocker):
        return True
    return type(value).__name__ == "ExecutionBlocker" and hasattr(value, "message")
