"""Per-prompt node progress, emitted as one `NodeProgress` per change."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.events import EventSink, NodeProgress


class ProgressTracker:
    """The state of every node started so far in one prompt.

    Each change goes out alone (`NodeProgress`): ComfyUI's `progress_state` frame, which
    lists every started node, is built by whoever sends it. A node an expansion added
    names its display, parent and real node (from `dynprompt`).
    """

    def __init__(
        self, prompt_id: str, sink: EventSink, dynprompt: DynamicPrompt | None = None
    ) -> None:
        self.prompt_id = prompt_id
        self._sink = sink
        self._dynprompt = dynprompt
        self._nodes: dict[str, dict[str, Any]] = {}

    def _set(self, node_id: str, value: float, total: float, state: str) -> None:
        dyn = self._dynprompt
        entry = {
            "value": value,
            "max": total,
            "state": state,
            "node_id": node_id,
            "prompt_id": self.prompt_id,
            "display_node_id": dyn.get_display_node_id(node_id) if dyn else node_id,
            "parent_node_id": dyn.get_parent_node_id(node_id) if dyn else None,
            "real_node_id": dyn.get_real_node_id(node_id) if dyn else node_id,
        }
        self._nodes[node_id] = entry
        self._sink(NodeProgress(self.prompt_id, node_id, entry))

    def start(self, node_id: str) -> None:
        self._set(node_id, 0.0, 1.0, "running")

    def update(self, node_id: str, value: float, total: float) -> None:
        self._set(node_id, value, total, "running")

    def finish(self, node_id: str) -> None:
        entry = self._nodes.get(node_id)
        if entry is None:
            # A node served from cache never started: ComfyUI reports it as 1 of 1.
            self._set(node_id, 1, 1, "finished")
        else:
            self._set(node_id, entry["max"], entry["max"], "finished")
