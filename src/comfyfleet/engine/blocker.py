"""ExecutionBlocker: a value that stops every node it reaches from running."""

from __future__ import annotations


class ExecutionBlocker:
    """Returned in place of an output; downstream nodes are skipped, not failed.

    With a message, the first node it blocks reports an `execution_error` event
    carrying that message (ComfyUI's behaviour); without one it is silent.
    """

    def __init__(self, message: str | None) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ExecutionBlocker({self.message!r})"
