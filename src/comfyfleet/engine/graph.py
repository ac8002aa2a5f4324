"""The set of nodes still to run in one prompt, dissolved in dependency order."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from comfyfleet.engine.dynamic import NodeNotFoundError
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.protocol.prompt import is_link


class DependencyCycleError(RuntimeError):
    """Pending nodes wait on each other (only expansions and lazy inputs can make this
    happen at run time: validation refuses a submitted cycle)."""


class PendingGraph:
    """Pending nodes with the count of pending nodes each one waits for.

    Lazy inputs are left out until a node asks for them (`require`); nodes
    whose outputs are already known (`is_ready`) are never added. `prompt` may
    grow while the graph is used (expansions add nodes to it).
    """

    def __init__(
        self,
        prompt: Mapping[str, dict[str, Any]],
        node_of: Callable[[str], NodeDef],
        types_of: Callable[[str], InputTypes],
        is_ready: Callable[[str], bool],
    ) -> None:
        self._prompt = prompt
        self._node_of = node_of
        self._types_of = types_of
        self._is_ready = is_ready
        self.pending: dict[str, None] = {}  # insertion-ordered set
        self._blockers: dict[str, int] = {}
        self._blocking: dict[str, set[str]] = {}
        self._held: set[str] = set()

    def add(self, node_id: str) -> None:
        """Add a node and, transitively, the non-lazy inputs it needs."""
        stack = [node_id]
        links: list[tuple[str, str]] = []
        while stack:
            current = stack.pop()
            if current in self.pending:
                continue
            if current not in self._prompt:
                raise NodeNotFoundError(f"Node {current} not found")
            self.pending[current] = None
            self._blockers[current] = 0
            self._blocking[current] = set()
            types = self._types_of(current)
            for name, value in self._prompt[current].get("inputs", {}).items():
                if not is_link(value) or self._is_ready(value[0]):
                    continue
                info = types.get(name)
                if info is not None and info.is_lazy:
                    continue
                stack.append(value[0])
                links.append((value[0], current))
        for source, target in links:
            self._link(source, target)

    def require(self, node_id: str, input_name: str) -> None:
        """Make a lazy input of `node_id` a real dependency."""
        value = self._prompt[node_id]["inputs"].get(input_name)
        if is_link(value):
            self.depend(node_id, value[0])

    def depend(self, node_id: str, source: str) -> None:
        """Make `node_id` wait for `source` (added if pending work) to run."""
        if not self._is_ready(source):
            self.add(source)
            self._link(source, node_id)

    def _link(self, source: str, target: str) -> None:
        if target not in self._blocking[source]:
            self._blocking[source].add(target)
            self._blockers[target] += 1

    def ready(self) -> list[str]:
        return [n for n in self.pending if self._blockers[n] == 0 and n not in self._held]

    def hold(self, node_id: str) -> None:
        """Keep a node out of `ready` while its async calls run."""
        self._held.add(node_id)

    def release(self, node_id: str) -> None:
        self._held.discard(node_id)

    def is_held(self, node_id: str) -> bool:
        return node_id in self._held

    def blocks_output(self, node_id: str, depth: int) -> bool:
        """Whether an output node is within `depth` links downstream."""
        frontier = {node_id}
        for _ in range(depth):
            frontier = {t for n in frontier for t in self._blocking.get(n, ())}
            if any(self._is_output(t) for t in frontier):
                return True
        return False

    def _is_output(self, node_id: str) -> bool:
        return self._node_of(node_id).is_output

    def pick(self, ready: list[str]) -> str:
        """ComfyUI's order: outputs and async nodes first, then what feeds an output."""
        for node_id in ready:
            node_def = self._node_of(node_id)
            if node_def.is_output or node_def.is_async:
                return node_id
        for depth in (1, 2):
            for node_id in ready:
                if self.blocks_output(node_id, depth):
                    return node_id
        return ready[0]

    def done(self, node_id: str) -> None:
        del self.pending[node_id]
        self._held.discard(node_id)
        for target in self._blocking.pop(node_id):
            self._blockers[target] -= 1

    def cycle(self) -> list[str]:
        """The pending nodes that are stuck waiting on each other."""
        return [n for n in self.pending if self._blockers[n] > 0]
