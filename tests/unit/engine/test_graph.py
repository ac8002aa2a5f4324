"""The pending graph: which nodes are ready, in which order, as nodes start, wait and end."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from comfyfleet.engine.graph import PendingGraph
from comfyfleet.engine.nodedef import InputTypes


class Prompt:
    """A prompt of nodes n0..nK whose inputs link to lower-numbered nodes (no cycles).

    By default the last node is the output and the others are async, as submits are;
    `kinds` gives nodes other kinds ("output", "async" or "plain")."""

    def __init__(
        self, inputs: dict[str, dict[str, tuple[str, bool]]], kinds: dict[str, str] | None = None
    ) -> None:
        # node -> input name -> (source node, lazy)
        self.inputs = inputs
        self.kinds = kinds
        self.nodes: dict[str, dict[str, Any]] = {
            node: {"class_type": "T", "inputs": {name: [src, 0] for name, (src, _) in ins.items()}}
            for node, ins in inputs.items()
        }
        self.finished: set[str] = set()
        self.output = list(inputs)[-1]

    def types_of(self, node: str) -> InputTypes:
        required = {
            name: ("X", {"lazy": True} if lazy else {})
            for name, (_, lazy) in self.inputs[node].items()
        }
        return InputTypes.parse({"required": required})

    def node_of(self, node: str) -> Any:
        if self.kinds is not None:
            kind = self.kinds[node]
            return SimpleNamespace(is_output=kind == "output", is_async=kind == "async")
        return SimpleNamespace(is_output=node == self.output, is_async=node != self.output)

    def graph(self) -> PendingGraph:
        return PendingGraph(self.nodes, self.node_of, self.types_of, self.finished.__contains__)


def expected_ready(graph: PendingGraph, waits_on: dict[str, set[str]], held: set[str]) -> list[str]:
    """What "ready" means, checked the slow way: every pending node, in the order it
    became pending, that waits on no pending node and is not held."""
    return [
        node
        for node in graph.pending
        if node not in held and not any(src in graph.pending for src in waits_on[node])
    ]


def expected_pick(
    prompt: Prompt, graph: PendingGraph, waits_on: dict[str, set[str]], ready: list[str]
) -> str:
    """ComfyUI's choice, the slow way: the first ready output or async node, else the
    first with an output one link downstream, else two links, else the first."""

    def downstream(nodes: set[str]) -> set[str]:
        return {t for t in graph.pending for n in nodes if n in waits_on[t]}

    def output_within(node: str, depth: int) -> bool:
        frontier = {node}
        for _ in range(depth):
            frontier = downstream(frontier)
            if any(prompt.node_of(t).is_output for t in frontier):
                return True
        return False

    for node in ready:
        if prompt.node_of(node).is_output or prompt.node_of(node).is_async:
            return node
    for depth in (1, 2):
        for node in ready:
            if output_within(node, depth):
                return node
    return ready[0]


@st.composite
def prompts(draw: st.DrawFn, kinds: bool = False) -> Prompt:
    size = draw(st.integers(2, 14))
    inputs: dict[str, dict[str, tuple[str, bool]]] = {}
    for k in range(size):
        sources = draw(st.lists(st.integers(0, k - 1), max_size=3, unique=True)) if k else []
        inputs[f"n{k}"] = {f"in{j}": (f"n{s}", draw(st.booleans())) for j, s in enumerate(sources)}
    if not kinds:
        return Prompt(inputs)
    chosen = {node: draw(st.sampled_from(["output", "async", "plain"])) for node in inputs}
    chosen[list(inputs)[-1]] = "output"
    return Prompt(inputs, chosen)


@settings(max_examples=400, deadline=None)
@given(prompt=prompts(kinds=True), choices=st.lists(st.integers(0, 5), min_size=1, max_size=80))
def test_ready_nodes_and_the_pick_match_the_definition_through_any_run(
    prompt: Prompt, choices: list[int]
) -> None:
    graph = prompt.graph()
    graph.add(prompt.output)
    # Which pending nodes each node waits on: its non-lazy inputs, then what it requires.
    waits_on = {
        node: {src for src, lazy in ins.values() if not lazy} for node, ins in prompt.inputs.items()
    }
    held: set[str] = set()
    for choice in choices:
        assert list(graph.ready()) == expected_ready(graph, waits_on, held)
        ready = list(graph.ready())
        if ready:
            assert graph.pick(ready) == expected_pick(prompt, graph, waits_on, ready)
        if choice == 0 and held:  # a held node's async calls end: it finishes
            node = sorted(held)[0]
            held.discard(node)
            graph.release(node)
            graph.done(node)
            prompt.finished.add(node)
        elif choice == 1 and held:  # released, but not done yet
            node = sorted(held)[-1]
            held.discard(node)
            graph.release(node)
        elif choice == 2 and ready:  # a lazy input becomes wanted
            node = ready[-1]
            lazy = [name for name, (_, is_lazy) in prompt.inputs[node].items() if is_lazy]
            if lazy:
                graph.require(node, lazy[0])
                source = prompt.inputs[node][lazy[0]][0]
                if source not in prompt.finished:
                    waits_on[node].add(source)
        elif choice == 3 and ready:  # an async node starts and waits
            node = graph.pick(ready)
            graph.hold(node)
            held.add(node)
        elif ready:  # a node runs to its end
            node = graph.pick(ready)
            graph.done(node)
            prompt.finished.add(node)
        if not graph.pending:
            break
    assert list(graph.ready()) == expected_ready(graph, waits_on, held)


def test_ready_nodes_keep_the_order_they_became_pending_in() -> None:
    prompt = Prompt({"a": {}, "b": {}, "c": {"x": ("a", False), "y": ("b", False)}})
    graph = prompt.graph()
    graph.add("c")
    assert list(graph.ready()) == ["b", "a"]  # the inputs' walk adds b first
    graph.hold("b")
    assert list(graph.ready()) == ["a"]
    graph.release("b")
    assert list(graph.ready()) == ["b", "a"]  # back in its place, not at the end
    graph.done("a")
    graph.done("b")
    assert list(graph.ready()) == ["c"]


def test_a_wide_prompt_does_not_rescan_its_waiting_nodes_for_each_node_it_starts() -> None:
    # As a prompt of thousands of submits feeding a collector runs: each submit starts
    # and is held while its job runs; then they end. Scanning every pending node per
    # start took seconds at this size (quadratic); the bound is generous.
    width = 10_000
    inputs: dict[str, dict[str, tuple[str, bool]]] = {f"s{k}": {} for k in range(width)}
    inputs["collect"] = {f"t{k}": (f"s{k}", False) for k in range(width)}
    prompt = Prompt(inputs)
    graph = prompt.graph()
    started = time.perf_counter()
    graph.add("collect")
    while ready := graph.ready():
        graph.hold(graph.pick(ready))
    for k in range(width):
        graph.release(f"s{k}")
        graph.done(f"s{k}")
        prompt.finished.add(f"s{k}")
    elapsed = time.perf_counter() - started
    assert list(graph.ready()) == ["collect"]
    assert elapsed < 3.0, f"{width} nodes took {elapsed:.2f} s"  # quadratic: tens of s


def test_a_wide_prompt_of_plain_nodes_picks_without_scanning_what_is_ready() -> None:
    # N/2 constants, each shown by its own output node: after each output runs, every
    # waiting constant is ready and none is an output. Scanning them all for each node
    # started (as ComfyUI does) took 18 s of a 10,000-node prompt; the bound (5 s) is
    # generous (one clean-clone run on a busy machine took 1.01 s).
    width = 5_000
    inputs: dict[str, dict[str, tuple[str, bool]]] = {}
    kinds: dict[str, str] = {}
    for k in range(width):
        inputs[f"p{k}"], kinds[f"p{k}"] = {}, "plain"
        inputs[f"v{k}"], kinds[f"v{k}"] = {"source": (f"p{k}", False)}, "output"
    prompt = Prompt(inputs, kinds)
    graph = prompt.graph()
    started = time.perf_counter()
    for k in range(width):
        graph.add(f"v{k}")
    order = []
    while ready := graph.ready():
        node = graph.pick(ready)
        order.append(node)
        graph.done(node)
        prompt.finished.add(node)
    elapsed = time.perf_counter() - started
    assert order[:4] == ["p0", "v0", "p1", "v1"]  # each output as soon as it can run
    assert len(order) == 2 * width
    assert elapsed < 5.0, f"{2 * width} nodes took {elapsed:.2f} s"
