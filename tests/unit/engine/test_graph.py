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
    """A prompt of nodes n0..nK whose inputs link to lower-numbered nodes (no cycles)."""

    def __init__(self, inputs: dict[str, dict[str, tuple[str, bool]]]) -> None:
        # node -> input name -> (source node, lazy)
        self.inputs = inputs
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
        # The last node is the output; the others are async, as submits are.
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


@st.composite
def prompts(draw: st.DrawFn) -> Prompt:
    size = draw(st.integers(2, 14))
    inputs: dict[str, dict[str, tuple[str, bool]]] = {}
    for k in range(size):
        sources = draw(st.lists(st.integers(0, k - 1), max_size=3, unique=True)) if k else []
        inputs[f"n{k}"] = {f"in{j}": (f"n{s}", draw(st.booleans())) for j, s in enumerate(sources)}
    return Prompt(inputs)


@settings(max_examples=300, deadline=None)
@given(prompt=prompts(), choices=st.lists(st.integers(0, 5), min_size=1, max_size=80))
def test_ready_nodes_match_the_definition_through_any_run(
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
    assert elapsed < 1.0, f"{width} nodes took {elapsed:.2f} s"
