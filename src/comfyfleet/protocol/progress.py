"""ComfyUI's `progress_state`: the entry of every node a prompt has started so far.

ComfyUI sends the whole state on each node start, progress update and finish, so a
prompt of N nodes sends O(N²) bytes. Inside comfyfleet a change travels alone (one
node's entry); `ProgressState` keeps the whole and builds the frame only where one is
sent (a client's socket, a follower of the event log).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Entry = dict[str, Any]


class ProgressState:
    """One prompt's `progress_state`, kept up to date from changes or whole frames.

    Entries keep the order in which their node first appeared, as ComfyUI's do."""

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        self.nodes: dict[str, Entry] = {}

    def change(self, node_id: str, entry: Entry) -> None:
        self.nodes[node_id] = entry

    def replace(self, nodes: Mapping[str, Entry]) -> None:
        """A whole frame (from a backend, or an older log) supersedes what was known."""
        self.nodes = dict(nodes)

    def changes_to(self, nodes: Mapping[str, Entry]) -> dict[str, Entry] | None:
        """The entries of the whole frame `nodes` that differ from this state, or None
        when the frame dropped a node (a change cannot express that)."""
        if any(node_id not in nodes for node_id in self.nodes):
            return None
        return {k: v for k, v in nodes.items() if self.nodes.get(k) != v}

    def frame(self) -> dict[str, Any]:
        """The `progress_state` payload ComfyUI would send now (a copy: keep it freely)."""
        return {"prompt_id": self.prompt_id, "nodes": dict(self.nodes)}
