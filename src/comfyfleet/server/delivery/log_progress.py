"""What the event log keeps of a prompt's `progress_state`, and how followers get it back.

ComfyUI's `progress_state` lists every node a prompt has started, on each node's
start, progress update and finish: O(N²) for N nodes. The log keeps only the entries
that changed (data `"changes": true`); the first frame of an attempt, and a backend's
frame that drops a node, are kept whole. `ProgressFrames` rebuilds the whole frames a
follower gets, exactly as the running gateway's clients got them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from comfyfleet.domain.prompt_events import PROGRESS_CHANGES, NewPromptEvent, PromptEvent
from comfyfleet.engine.events import NodeProgress
from comfyfleet.protocol.progress import Entry, ProgressState

PROGRESS = "progress_state"


class ProgressFrames:
    """Turns a prompt's logged progress changes back into ComfyUI's whole frames."""

    def __init__(self, prompt_id: str) -> None:
        self.state = ProgressState(prompt_id)

    def apply(self, event: PromptEvent) -> bool:
        """Take in a logged event; whether it was a `progress_state`."""
        if event.frame is not None or event.type != PROGRESS:
            return False
        nodes = event.data.get("nodes")
        nodes = nodes if isinstance(nodes, dict) else {}
        if event.data.get(PROGRESS_CHANGES):
            for node_id, entry in nodes.items():
                self.state.change(node_id, entry)
        else:  # kept whole (or logged before changes were)
            self.state.replace(nodes)
        return True

    def as_sent(self, event: PromptEvent) -> PromptEvent:
        """`event` as the prompt's client got it: a progress change as the whole frame."""
        return replace(event, data=self.state.frame()) if self.apply(event) else event


@dataclass
class Attempt:
    """What this process is logging of one attempt of a prompt."""

    progress: ProgressState
    size: int = 0  # bytes appended

    def progress_event(self, node_id: str, entry: Entry) -> NewPromptEvent:
        """The log's form of a node's change: the change alone, or the first whole."""
        first = not self.progress.nodes
        self.progress.change(node_id, entry)
        nodes = {node_id: entry}
        data = {"prompt_id": self.progress.prompt_id, "nodes": nodes}
        return NewPromptEvent(self.progress.prompt_id, PROGRESS, data if first else _changes(data))

    def whole_frame(self, data: dict[str, Any]) -> NewPromptEvent:
        """The log's form of a whole frame (a backend's): the entries it changed."""
        nodes = data.get("nodes")
        nodes = nodes if isinstance(nodes, dict) else {}
        changed = self.progress.changes_to(nodes) if self.progress.nodes else None
        self.progress.replace(nodes)
        if changed is None:
            return NewPromptEvent(self.progress.prompt_id, PROGRESS, data)
        frame = {"prompt_id": self.progress.prompt_id, "nodes": changed}
        return NewPromptEvent(self.progress.prompt_id, PROGRESS, _changes(frame))

    def shows_state(self, event: NodeProgress) -> bool:
        """Whether the change starts or finishes its node (not a running value update)."""
        known = self.progress.nodes.get(event.node_id)
        return known is None or known.get("state") != event.entry.get("state")


def _changes(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, PROGRESS_CHANGES: True}
