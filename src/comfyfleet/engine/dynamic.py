"""The prompt as it grows while it runs: the submitted nodes plus those expansions add.

A node may return `{"result": ..., "expand": {id: node, ...}}`: new (ephemeral)
nodes join the run. Each remembers the node that created it (its parent), the
node the frontend shows it as (its display node: the parent unless the node sets
`override_display_id`) and the submitted node it descends from (its real node).

This is also what a node asking for the hidden DYNPROMPT input receives, with
ComfyUI's method names.
"""

from __future__ import annotations

import threading
from typing import Any

from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import Prompt


class DynamicPrompt:
    def __init__(self, prompt: Prompt) -> None:
        self._original = prompt
        # Every node, submitted then ephemeral: one mapping the scheduler of the run reads.
        self.nodes: dict[str, dict[str, Any]] = dict(prompt)
        self._parent: dict[str, str] = {}
        self._display: dict[str, str] = {}
        self._real: dict[str, str] = {}
        # Nodes are added on the event loop while node code in worker threads may read.
        self._lock = threading.Lock()

    def get_node(self, node_id: str) -> dict[str, Any]:
        node = self.nodes.get(node_id)
        if node is None:
            raise NodeNotFoundError(f"Node {node_id} not found")
        return node

    def has_node(self, node_id: str) -> bool:
        return node_id in self.nodes

    def all_node_ids(self) -> set[str]:
        with self._lock:
            return set(self.nodes)

    def get_original_prompt(self) -> Prompt:
        return self._original

    def is_ephemeral(self, node_id: str) -> bool:
        return node_id in self._parent

    def get_parent_node_id(self, node_id: str) -> str | None:
        return self._parent.get(node_id)

    def get_real_node_id(self, node_id: str) -> str:
        """The submitted node this one descends from (itself when submitted)."""
        return self._real.get(node_id, node_id)

    def get_display_node_id(self, node_id: str) -> str:
        """The node the frontend shows this one as (itself when submitted)."""
        return self._display.get(node_id, node_id)

    def add_ephemeral_node(
        self, node_id: str, node: dict[str, Any], parent_id: str, display_id: str
    ) -> None:
        with self._lock:
            self.nodes[node_id] = node
            self._parent[node_id] = parent_id
            # Resolved once here: loops nest expansions thousands deep, and every event
            # of every node asks for these.
            self._real[node_id] = self.get_real_node_id(parent_id)
            self._display[node_id] = self.get_display_node_id(display_id)


class NodeNotFoundError(ComfyfleetError, LookupError):
    """A link or lookup names a node that is in neither the prompt nor an expansion."""
