"""The set of nodes still to run in one prompt, dissolved in dependency order."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
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

    The nodes ready to run are kept as they change, in the order they became
    pending: a wide prompt (hundreds of submits held while their jobs run) would
    otherwise scan every pending node for each node it starts.
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
        self._order: dict[str, int] = {}  # when each pending node was added
        self._numbers = itertools.count()
        # The ready nodes (no pending blockers, not held), sorted by `_order`.
        self._ready: list[str] = []

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
            self._order[current] = next(self._numbers)
            self._blockers[current] = 0
            self._blocking[current] = set()
            self._make_ready(current)
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
            self._unready(target)

    def ready(self) -> Sequence[str]:
        """The nodes that can run now, in the order they became pending (a live view:
        read it before the graph changes)."""
        return self._ready

    def _ready_at(self, node_id: str) -> tuple[int, bool]:
        """Where a pending node is or would go in `_ready`, and whether it is there."""
        at = bisect.bisect_left(self._ready, self._order[node_id], key=self._order.__getitem__)
        return at, at < len(self._ready) and self._ready[at] == node_id

    def _make_ready(self, node_id: str) -> None:
        if node_id not in self._order:  # not pending
            return
        if self._blockers[node_id] == 0 and node_id not in self._held:
            at, there = self._ready_at(node_id)
            if not there:
                self._ready.insert(at, node_id)

    def _unready(self, node_id: str) -> None:
        if node_id in self._order:
            at, there = self._ready_at(node_id)
            if there:
                del self._ready[at]

    def hold(self, node_id: str) -> None:
        """Keep a node out of `ready` while its async calls run."""
        self._held.add(node_id)
        self._unready(node_id)

    def release(self, node_id: str) -> None:
        self._held.discard(node_id)
        self._make_ready(node_id)

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

    def pick(self, ready: Sequence[str]) -> str:
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
        self._unready(node_id)
        del self.pending[node_id]
        del self._order[node_id]
        self._held.discard(node_id)
        for target in self._blocking.pop(node_id):
            self._blockers[target] -= 1
            self._make_ready(target)

    def cycle(self) -> list[str]:
        """The pending nodes that are stuck waiting on each other."""
        return [n for n in self.pending if self._blockers[n] > 0]
