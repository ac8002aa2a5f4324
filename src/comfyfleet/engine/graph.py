"""The set of nodes still to run in one prompt, dissolved in dependency order."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comfyfleet.engine.dynamic import NodeNotFoundError
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_link


class DependencyCycleError(ComfyfleetError, RuntimeError):
    """Pending nodes wait on each other (only expansions and lazy inputs can make this
    happen at run time: validation refuses a submitted cycle)."""


class PendingGraph:
    """Pending nodes with the count of pending nodes each one waits for.

    Lazy inputs are left out until a node asks for them (`require`); nodes
    whose outputs are already known (`is_ready`) are never added. `prompt` may
    grow while the graph is used (expansions add nodes to it).

    The nodes ready to run are kept as they change, in the order they became
    pending: a wide prompt (hundreds of submits held while their jobs run) would
    otherwise scan every pending node for each node it starts. So are the ready nodes
    `pick` prefers, by rank (`_rank`): a prompt of thousands of plain nodes would
    otherwise scan the ready list for each node it starts, as ComfyUI does.
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
        self._waits_on: dict[str, set[str]] = {}  # the pending nodes each one waits on
        self._to_output: dict[str, int] = {}  # links to the nearest output, if 1 or 2
        # The ready nodes of ranks 0, 1 and 2 (see `_rank`), each sorted by `_order`.
        self._ranked: tuple[list[str], list[str], list[str]] = ([], [], [])

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
            self._waits_on[current] = set()
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
            self._waits_on[target].add(source)
            self._blockers[target] += 1
            self._unready(target)
            # An output one link on, or two: what `pick` prefers, once ready.
            if self._is_output(target):
                self._nearer_output(source, 1)
                for before in self._waits_on[source]:
                    self._nearer_output(before, 2)
            elif self._to_output.get(target) == 1:
                self._nearer_output(source, 2)

    def _nearer_output(self, node_id: str, links: int) -> None:
        """`node_id` is `links` from an output (only ever nearer while it is pending)."""
        if self._to_output.get(node_id, 3) <= links:
            return
        ready = self._ready_at(node_id)[1]
        if ready:
            self._unready(node_id)
        self._to_output[node_id] = links
        if ready:
            self._make_ready(node_id)

    def _rank(self, node_id: str) -> int:
        """`pick`'s preference: 0 an output or async node, 1 a node an output waits on,
        2 one an output waits on through one more node, 3 any other."""
        node_def = self._node_of(node_id)
        if node_def.is_output or node_def.is_async:
            return 0
        return self._to_output.get(node_id, 3)

    def ready(self) -> Sequence[str]:
        """The nodes that can run now, in the order they became pending (a live view:
        read it before the graph changes)."""
        return self._ready

    def _ready_at(self, node_id: str, nodes: list[str] | None = None) -> tuple[int, bool]:
        """Where a pending node is or would go in `nodes` (a list sorted by `_order`:
        `_ready` by default), and whether it is there."""
        nodes = self._ready if nodes is None else nodes
        at = bisect.bisect_left(nodes, self._order[node_id], key=self._order.__getitem__)
        return at, at < len(nodes) and nodes[at] == node_id

    def _make_ready(self, node_id: str) -> None:
        if node_id not in self._order:  # not pending
            return
        if self._blockers[node_id] == 0 and node_id not in self._held:
            at, there = self._ready_at(node_id)
            if not there:
                self._ready.insert(at, node_id)
                rank = self._rank(node_id)
                if rank < len(self._ranked):
                    ranked = self._ranked[rank]
                    ranked.insert(self._ready_at(node_id, ranked)[0], node_id)

    def _unready(self, node_id: str) -> None:
        if node_id in self._order:
            at, there = self._ready_at(node_id)
            if there:
                del self._ready[at]
                rank = self._rank(node_id)
                if rank < len(self._ranked):
                    ranked = self._ranked[rank]
                    del ranked[self._ready_at(node_id, ranked)[0]]

    def hold(self, node_id: str) -> None:
        """Keep a node out of `ready` while its async calls run."""
        self._held.add(node_id)
        self._unready(node_id)

    def release(self, node_id: str) -> None:
        self._held.discard(node_id)
        self._make_ready(node_id)

    def is_held(self, node_id: str) -> bool:
        return node_id in self._held

    def _is_output(self, node_id: str) -> bool:
        return self._node_of(node_id).is_output

    def pick(self, ready: Sequence[str]) -> str:
        """ComfyUI's order: the first ready output or async node, else the first an
        output waits on, else the first an output waits on through one more node, else
        the first. (`ready` is `ready()`, kept for the callers' reading.)"""
        for ranked in self._ranked:
            if ranked:
                return ranked[0]
        return ready[0]

    def done(self, node_id: str) -> None:
        self._unready(node_id)
        del self.pending[node_id]
        del self._order[node_id]
        self._held.discard(node_id)
        self._to_output.pop(node_id, None)
        del self._waits_on[node_id]
        for target in self._blocking.pop(node_id):
            self._blockers[target] -= 1
            self._waits_on[target].discard(node_id)
            self._make_ready(target)

    def cycle(self) -> list[str]:
        """The pending nodes that are stuck waiting on each other."""
        return [n for n in self.pending if self._blockers[n] > 0]
