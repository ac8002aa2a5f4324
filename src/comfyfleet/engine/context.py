"""What a running node can reach: its own prompt's progress, text and interrupt flag.

ComfyUI keeps these in process globals (current client, current node, interrupt
flag, progress hook). Here each node call runs with a `NodeContext` in a
context variable, so concurrent prompts never see each other's state, and a
node function running in a worker thread (which copies the context) still
reports to its own prompt.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from comfyfleet import imaging
from comfyfleet.errors import ComfyfleetError


class InterruptProcessingException(ComfyfleetError):
    """Raised inside a node when its prompt has been interrupted."""


@dataclass(frozen=True)
class Preview:
    """An encoded preview image for a progress update."""

    format: str  # "PNG" or "JPEG"
    data: bytes


class RunControl(Protocol):
    """The per-prompt side of a node context; callable from any thread."""

    @property
    def interrupted(self) -> bool:
        """The prompt was interrupted: it ends."""

    @property
    def stopping(self) -> bool:
        """A node should stop now: interrupted, or the prompt is held back (its node then
        runs again later; see engine/run.py RunHandle)."""

    def report_progress(
        self, node_id: str, value: float, total: float, preview: Preview | None
    ) -> None: ...

    def send_text(self, node_id: str, text: str) -> None: ...


@dataclass(frozen=True)
class NodeContext:
    prompt_id: str
    node_id: str
    display_node_id: str
    list_index: int | None
    control: RunControl

    @property
    def interrupted(self) -> bool:
        """What a node looks at to stop early (ComfyUI's processing_interrupted)."""
        return self.control.stopping

    def throw_if_interrupted(self) -> None:
        if self.control.stopping:
            raise InterruptProcessingException()

    def progress(self, value: float, total: float, preview: Any = None) -> None:
        """Report progress; `preview` is ComfyUI's `(format, PIL image, max_size)` or a Preview."""
        self.throw_if_interrupted()
        self.control.report_progress(self.node_id, value, total, _as_preview(preview))

    def send_text(self, text: str) -> None:
        self.control.send_text(self.node_id, text)


def _as_preview(preview: Any) -> Preview | None:
    if preview is None or isinstance(preview, Preview):
        return preview
    fmt, image, max_size = [*list(preview), None, None, None][:3]
    fmt = str(fmt or "JPEG").upper()
    return Preview(fmt, imaging.encode_preview(image, fmt, max_size))


_current: ContextVar[NodeContext | None] = ContextVar("comfyfleet_node", default=None)


def current_node() -> NodeContext | None:
    """The context of the node whose code is running, or None outside node code."""
    return _current.get()


def set_current_node(ctx: NodeContext | None) -> Any:
    return _current.set(ctx)


def reset_current_node(token: Any) -> None:
    _current.reset(token)


class ProgressBar:
    """ComfyUI's `comfy.utils.ProgressBar`, bound to the node that created it."""

    def __init__(self, total: float, node_id: str | None = None) -> None:
        self.total = total
        self.current = 0.0
        self._ctx = current_node()
        self._node_id = node_id

    def update_absolute(
        self, value: float, total: float | None = None, preview: Any = None
    ) -> None:
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        if self._ctx is not None:
            ctx = self._ctx
            if self._node_id is not None and self._node_id != ctx.node_id:
                ctx = NodeContext(ctx.prompt_id, self._node_id, self._node_id, None, ctx.control)
            ctx.progress(self.current, self.total, preview)

    def update(self, value: float) -> None:
        self.update_absolute(self.current + value)


def send_progress_text(text: str, node_id: str | None = None) -> None:
    """Send a TEXT frame for the current node (ComfyUI's `send_progress_text`)."""
    ctx = current_node()
    if ctx is not None:
        ctx.control.send_text(node_id or ctx.node_id, text)
