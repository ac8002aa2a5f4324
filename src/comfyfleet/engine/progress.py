"""Per-prompt node progress, emitted as ComfyUI's `progress_state` events."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.events import EventSink, Message


class ProgressTracker:
    """The state of every node started so far in one prompt.

    Each `progress_state` carries all of them, as ComfyUI sends it; a node an
    expansion added names its display, parent and real node (from `dynprompt`).
    """

    def __init__(
        self, prompt_id: str, sink: EventSink, dynprompt: DynamicPrompt | None = None
    ) -> None:
        self.prompt_id = prompt_id
        self._sink = sink
        self._dynprompt = dynprompt
        self._nodes: dict[str, dict[str, Any]] = {}

    def _entry(self, node_id: str, value: float, total: float, state: str) -> dict[str, Any]:
        dyn = self._dynprompt
        return {
            "value": value,
            "max": total,
            "state": state,
            "node_id": node_id,
            "prompt_id": self.prompt_id,
            "display_node_id": dyn.get_display_node_id(node_id) if dyn else node_id,
            "parent_node_id": dyn.get_parent_node_id(node_id) if dyn else None,
            "real_node_id": dyn.get_real_node_id(node_id) if dyn else node_id,
        }

    def _emit(self) -> None:
        # Entries are replaced, never changed, so a shallow copy is a true snapshot: a
        # wide prompt sends this for every node event, and copying each entry too
        # made every event cost as much as the whole prompt.
        nodes = dict(self._nodes)
        self._sink(Message("progress_state", {"prompt_id": self.prompt_id, "nodes": nodes}))

    def start(self, node_id: str) -> None:
        self._nodes[node_id] = self._entry(node_id, 0.0, 1.0, "running")
        self._emit()

    def update(self, node_id: str, value: float, total: float) -> None:
        self._nodes[node_id] = self._entry(node_id, value, total, "running")
        self._emit()

    def finish(self, node_id: str) -> None:
        entry = self._nodes.get(node_id)
        if entry is None:
            # A node served from cache never started: ComfyUI reports it as 1 of 1.
            self._nodes[node_id] = self._entry(node_id, 1, 1, "finished")
        else:
            self._nodes[node_id] = {**entry, "state": "finished", "value": entry["max"]}
        self._emit()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {node_id: dict(entry) for node_id, entry in self._nodes.items()}

    def running_node(self) -> str | None:
        """The most recently started node that has not finished."""
        for node_id in reversed(self._nodes):
            if self._nodes[node_id]["state"] == "running":
                return node_id
        return None
