"""Graph expansion: nodes that return `{"result", "expand"}` and the subgraphs they add.

The nodes here build their subgraphs by hand, in the plain dict shapes ComfyUI's
`GraphBuilder` produces: ids prefixed by the expanding node's id, links into the
subgraph and out to the rest of the prompt.
"""

from __future__ import annotations

import asyncio
import sys
import time
import types
from typing import Any

import numpy as np
import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.engine.expansion import MAX_EXPANDED_NODES
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.run import RunHandle
from comfyfleet.protocol.prompt import is_link
from tests.helpers import Recorder

CALLS: list[tuple[str, Any]] = []
INT = ("INT", {"default": 0, "min": -(10**9), "max": 10**9})


class Num:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> tuple[int]:
        CALLS.append(("Num", value))
        return (value,)


class Add:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"a": INT, "b": INT}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, a: int, b: int) -> tuple[int]:
        CALLS.append(("Add", (a, b)))
        return (a + b,)


class Show:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {})}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"

    def run(self, value: Any, unique_id: str) -> dict[str, Any]:
        return {"ui": {"value": [value], "id": [unique_id]}}


class Collect:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"values": ("*", {})}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    INPUT_IS_LIST = True
    FUNCTION = "run"

    def run(self, values: list[Any]) -> dict[str, Any]:
        return {"ui": {"values": values}}


class Range:
    """1, 2, ... count, as a list output."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"count": INT}}

    RETURN_TYPES = ("INT",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"

    def run(self, count: int) -> tuple[list[int]]:
        return (list(range(1, count + 1)),)


class AddViaGraph:
    """a + b, computed by a subgraph (Num(b) -> Add) the result links into."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"a": INT, "b": INT},
            "optional": {"note": ("STRING", {})},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, a: int, b: int, unique_id: str, note: str = "") -> dict[str, Any]:
        num, add, show = f"{unique_id}.num", f"{unique_id}.add", f"{unique_id}.show"
        graph = {
            num: {"class_type": "Num", "inputs": {"value": b}},
            add: {"class_type": "Add", "inputs": {"a": a, "b": [num, 0]}},
            show: {"class_type": "Show", "inputs": {"value": [num, 0]}},
        }
        return {"result": ([add, 0],), "expand": graph}


class Mixed:
    """Per call: a plain tuple, a `result` dict, or an expansion (ComfyUI's mixed returns)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("INT", "INT")
    FUNCTION = "run"

    def run(self, value: int, unique_id: str) -> Any:
        if value == 1:
            return (10, -1)
        if value == 2:
            return {"result": (20, -2)}
        node = f"{unique_id}.{value}"
        graph = {node: {"class_type": "Num", "inputs": {"value": value * 10}}}
        return {"result": ([node, 0], -value), "expand": graph}


class Repeat:
    """Adds `step` to `value`, `times` times: one Add, then a copy of itself (a loop)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"value": INT, "times": INT, "step": INT},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int, times: int, step: int, unique_id: str) -> Any:
        if times <= 0:
            return (value,)
        add, again = f"{unique_id}.add", f"{unique_id}.again"
        graph = {
            add: {"class_type": "Add", "inputs": {"a": value, "b": step}},
            again: {
                "class_type": "Repeat",
                "inputs": {"value": [add, 0], "times": times - 1, "step": step},
            },
        }
        return {"result": ([again, 0],), "expand": graph}


class WhileOpen:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT}}

    RETURN_TYPES = ("FLOW", "INT")
    FUNCTION = "run"

    def run(self, value: int) -> tuple[str, int]:
        return ("flow", value)


class WhileClose:
    """While `value` < `limit`, runs the loop body (the nodes between its WhileOpen and
    itself, read from DYNPROMPT) again on `value`, as ComfyUI's TestWhileLoopClose does."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"flow": ("FLOW", {"rawLink": True}), "value": INT, "limit": INT},
            "hidden": {"dynprompt": "DYNPROMPT", "unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, flow: list[Any], value: int, limit: int, dynprompt: Any, unique_id: str) -> Any:
        if value >= limit:
            return (value,)
        open_id = flow[0]
        body = _between(dynprompt, open_id, unique_id)

        def copy_of(node_id: str) -> str:
            return f"{unique_id}.r." + ("close" if node_id == unique_id else node_id)

        graph = {}
        for node_id in body:
            node = dynprompt.get_node(node_id)
            inputs = {
                name: [copy_of(v[0]), v[1]] if is_link(v) and v[0] in body else v
                for name, v in node["inputs"].items()
            }
            graph[copy_of(node_id)] = {
                "class_type": node["class_type"],
                "inputs": inputs,
                "override_display_id": node_id,
            }
        graph[copy_of(open_id)]["inputs"]["value"] = value
        return {"result": ([copy_of(unique_id), 0],), "expand": graph}


def _between(dynprompt: Any, open_id: str, close_id: str) -> set[str]:
    """The nodes on paths from `open_id` to `close_id`, both included."""
    children: dict[str, set[str]] = {}
    stack, seen = [close_id], {close_id}
    while stack:
        node_id = stack.pop()
        for value in dynprompt.get_node(node_id)["inputs"].values():
            if is_link(value):
                children.setdefault(value[0], set()).add(node_id)
                if value[0] not in seen:
                    seen.add(value[0])
                    stack.append(value[0])
    body, stack = {open_id}, [open_id]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in body:
                body.add(child)
                stack.append(child)
    return body


class Switch:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "choose_a": ("BOOLEAN", {}),
                "a": ("INT", {"lazy": True}),
                "b": ("INT", {"lazy": True}),
            }
        }

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def check_lazy_status(self, choose_a: bool, a: Any = None, b: Any = None) -> list[str]:
        return ["a"] if choose_a else ["b"]

    def run(self, choose_a: bool, a: Any = None, b: Any = None) -> tuple[Any]:
        return (a if choose_a else b,)


class LazyPick:
    """Expands into two branches behind a lazy Switch: only the chosen one runs."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"choose_a": ("BOOLEAN", {})}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, choose_a: bool, unique_id: str) -> dict[str, Any]:
        a, b, switch = f"{unique_id}.a", f"{unique_id}.b", f"{unique_id}.switch"
        graph = {
            a: {"class_type": "Num", "inputs": {"value": 100}},
            b: {"class_type": "Num", "inputs": {"value": 200}},
            switch: {
                "class_type": "Switch",
                "inputs": {"choose_a": choose_a, "a": [a, 0], "b": [b, 0]},
            },
        }
        return {"result": ([switch, 0],), "expand": graph}


class Nap:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT, "seconds": ("FLOAT", {})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    async def run(self, value: int, seconds: float) -> tuple[int]:
        await asyncio.sleep(seconds)
        return (value,)


class ParallelNaps:
    """Expands into three async naps added up: they run at once."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"seconds": ("FLOAT", {})}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, seconds: float, unique_id: str) -> dict[str, Any]:
        naps = [f"{unique_id}.nap{i}" for i in range(3)]
        graph: dict[str, Any] = {
            nap: {"class_type": "Nap", "inputs": {"value": i + 1, "seconds": seconds}}
            for i, nap in enumerate(naps)
        }
        graph[f"{unique_id}.sum1"] = {
            "class_type": "Add",
            "inputs": {"a": [naps[0], 0], "b": [naps[1], 0]},
        }
        graph[f"{unique_id}.sum2"] = {
            "class_type": "Add",
            "inputs": {"a": [f"{unique_id}.sum1", 0], "b": [naps[2], 0]},
        }
        return {"result": ([f"{unique_id}.sum2", 0],), "expand": graph}


class Boom:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> tuple[int]:
        raise ValueError(f"boom at {value}")


class Expand:
    """Returns the subgraph in its `graph` input as is, its result linked to `result_node`."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"graph": ("*", {}), "result_node": ("STRING", {})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, graph: Any, result_node: str) -> dict[str, Any]:
        return {"result": ([result_node, 0],), "expand": graph}


class BuilderUser:
    """Names its subgraph's node the way ComfyUI's GraphBuilder does, from the prefix
    ComfyUI's executor sets before each call."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": INT}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> dict[str, Any]:
        builder = sys.modules["comfy_execution.graph_utils"].GraphBuilder
        node = builder.alloc_prefix() + "1"
        return {
            "result": ([node, 0],),
            "expand": {node: {"class_type": "Num", "inputs": {"value": value}}},
        }


class Total:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"values": ("ARRAY", {})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"

    def run(self, values: Any) -> tuple[float]:
        return (float(np.sum(values)),)


class TotalViaGraph:
    """Hands a 100x100 array (zeros but its centre) to a subgraph node as a constant."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"centre": ("FLOAT", {})}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"

    def run(self, centre: float, unique_id: str) -> dict[str, Any]:
        values = np.zeros((100, 100))
        values[50, 50] = centre
        node = f"{unique_id}.total"
        graph = {node: {"class_type": "Total", "inputs": {"values": values}}}
        return {"result": ([node, 0],), "expand": graph}


NODES: tuple[type, ...] = (
    Num,
    Add,
    Show,
    Collect,
    Range,
    AddViaGraph,
    Mixed,
    Repeat,
    WhileOpen,
    WhileClose,
)
NODES += (Switch, LazyPick, Nap, ParallelNaps, Boom, Expand, BuilderUser, Total, TotalViaGraph)


@pytest.fixture
def registry(registry: NodeRegistry) -> NodeRegistry:
    registry.add_pack({cls.__name__: cls for cls in NODES}, pack="tests", python_module="tests")
    CALLS.clear()
    return registry


def executing(sink: Recorder) -> list[tuple[str, str]]:
    """(node, display_node) of every `executing` frame but the last."""
    return [(m.data["node"], m.data["display_node"]) for m in sink.messages("executing")[:-1]]


async def test_a_result_links_into_the_subgraph_it_expands_to(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Num", "inputs": {"value": 2}},
        "2": {"class_type": "AddViaGraph", "inputs": {"a": ["1", 0], "b": 3}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["3"] == {"value": [5], "id": ["3"]}
    # The subgraph's output node ran and is in the history, under its own id.
    assert result.outputs["2.show"] == {"value": [3], "id": ["2.show"]}
    assert result.meta["2.show"] == {
        "node_id": "2.show",
        "display_node": "2",
        "parent_node": "2",
        "real_node_id": "2",
    }
    frames = executing(sink)
    assert set(frames) == {
        ("1", "1"),
        ("2", "2"),
        ("2.num", "2"),
        ("2.add", "2"),
        ("2.show", "2"),
    } | {("3", "3")}
    assert frames.index(("2", "2")) < frames.index(("2.add", "2")) < frames.index(("3", "3"))
    assert [
        m.data["display_node"] for m in sink.messages("executed") if m.data["node"] == "2.show"
    ] == ["2"]
    last_state = sink.messages("progress_state")[-1].data["nodes"]
    assert last_state["2.add"]["display_node_id"] == "2"
    assert last_state["2.add"]["parent_node_id"] == "2"
    assert last_state["2.add"]["real_node_id"] == "2"
    assert last_state["2"]["state"] == "finished"
    assert set(result.executed) == {"1", "2", "2.num", "2.add", "2.show", "3"}


async def test_calls_mixing_tuples_results_and_expansions_merge_in_call_order(
    engine: Engine,
) -> None:
    prompt = {
        "1": {"class_type": "Range", "inputs": {"count": 3}},
        "2": {"class_type": "Mixed", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "Collect", "inputs": {"values": ["2", 0]}},
        "4": {"class_type": "Collect", "inputs": {"values": ["2", 1]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["3"] == {"values": [10, 20, 30]}
    assert result.outputs["4"] == {"values": [-1, -2, -3]}


async def test_an_expanded_node_expands_again_as_a_loop(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Num", "inputs": {"value": 7}},
        "2": {"class_type": "Repeat", "inputs": {"value": ["1", 0], "times": 40, "step": 3}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["3"]["value"] == [7 + 40 * 3]
    assert len([c for c in CALLS if c[0] == "Add"]) == 40
    # Every copy, however deep, is shown as the submitted node it came from.
    nested = [frame for frame in executing(sink) if frame[0].startswith("2.")]
    assert len(nested) == 80 and {display for _, display in nested} == {"2"}


async def test_a_loop_body_read_from_dynprompt_runs_until_its_condition(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Num", "inputs": {"value": 0}},
        "2": {"class_type": "WhileOpen", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "Add", "inputs": {"a": ["2", 1], "b": 3}},
        "4": {
            "class_type": "WhileClose",
            "inputs": {"flow": ["2", 0], "value": ["3", 0], "limit": 10},
        },
        "5": {"class_type": "Show", "inputs": {"value": ["4", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["5"]["value"] == [12]
    assert [c for c in CALLS if c[0] == "Add"] == [("Add", (v, 3)) for v in (0, 3, 6, 9)]
    # Copies of the body show as the body's own nodes (override_display_id).
    adds = [display for node, display in executing(sink) if node.endswith(".3")]
    assert adds == ["3", "3", "3"]


async def test_lazy_inputs_inside_a_subgraph_evaluate_only_the_chosen_branch(
    engine: Engine,
) -> None:
    prompt = {
        "1": {"class_type": "LazyPick", "inputs": {"choose_a": False}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["2"]["value"] == [200]
    assert CALLS == [("Num", 200)]


async def test_async_nodes_of_a_subgraph_run_at_once(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "ParallelNaps", "inputs": {"seconds": 1.0}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    started = time.monotonic()
    _, result = await engine.run_prompt(prompt)
    elapsed = time.monotonic() - started
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["2"]["value"] == [6]
    assert elapsed < 2.5, elapsed  # one after the other would take 3 s


async def test_a_failure_inside_a_subgraph_is_reported_on_the_submitted_node(
    engine: Engine,
) -> None:
    graph = {"2.boom": {"class_type": "Boom", "inputs": {"value": 4}}}
    prompt = {
        "2": {
            "class_type": "Expand",
            "inputs": {"graph": {"__value__": graph}, "result_node": "2.boom"},
        },
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None and result.status == "error"
    error = sink.messages("execution_error")[0].data
    assert error["node_id"] == "2" and error["node_type"] == "Expand"
    assert error["exception_message"] == "boom at 4\n"
    assert error["exception_type"] == "ValueError"
    assert error["current_inputs"] == {"value": [4]}


async def test_a_cycle_made_by_an_expansion_is_an_error_of_the_expanding_node(
    engine: Engine,
) -> None:
    graph = {
        "2.a": {"class_type": "Add", "inputs": {"a": ["2.b", 0], "b": 1}},
        "2.b": {"class_type": "Add", "inputs": {"a": ["2.a", 0], "b": 1}},
    }
    prompt = {
        "2": {
            "class_type": "Expand",
            "inputs": {"graph": {"__value__": graph}, "result_node": "2.b"},
        },
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None and result.status == "error" and result.error is not None
    assert result.error["node_id"] == "2"
    assert result.error["exception_type"] == "graph.DependencyCycleError"
    assert result.error["exception_message"] == "Dependency cycle detected"


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        ({"1": {"class_type": "Num", "inputs": {"value": 1}}}, "'1' is already in the prompt"),
        ({"2.x": {"class_type": "NoSuchNode", "inputs": {}}}, "'NoSuchNode' does not exist"),
        ({"2.x": {"class_type": "Num", "inputs": ["value"]}}, "'inputs' must be a dict"),
        ({"2.x": {"class_type": "Add", "inputs": {"a": ["nowhere", 0], "b": 1}}}, "nowhere"),
        ([1, 2], "'expand' must be a dict of nodes"),
    ],
)
async def test_a_subgraph_that_cannot_join_fails_its_node(
    engine: Engine, graph: Any, message: str
) -> None:
    prompt = {
        "1": {"class_type": "Num", "inputs": {"value": 1}},
        "2": {
            "class_type": "Expand",
            "inputs": {"graph": {"__value__": graph}, "result_node": "2.x"},
        },
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None and result.status == "error" and result.error is not None
    assert result.error["node_id"] == "2"
    assert message in result.error["exception_message"]


async def test_expansions_may_not_add_more_nodes_than_the_bound(engine: Engine) -> None:
    graph = {
        f"2.{i}": {"class_type": "Num", "inputs": {"value": i}}
        for i in range(MAX_EXPANDED_NODES + 1)
    }
    prompt = {
        "2": {
            "class_type": "Expand",
            "inputs": {"graph": {"__value__": graph}, "result_node": "2.0"},
        },
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None and result.error is not None
    assert f"at most {MAX_EXPANDED_NODES} nodes" in result.error["exception_message"]
    assert CALLS == []


async def test_an_identical_prompt_with_an_expansion_is_fully_cached(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Num", "inputs": {"value": 2}},
        "2": {"class_type": "AddViaGraph", "inputs": {"a": ["1", 0], "b": 3}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    await engine.run_prompt(prompt)
    CALLS.clear()
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None and result.outputs["3"]["value"] == [5]
    assert CALLS == []
    assert executing(sink) == []


async def test_expanded_nodes_are_cached_when_their_parent_runs_again(engine: Engine) -> None:
    def prompt(note: str) -> dict[str, Any]:
        return {
            "1": {"class_type": "Num", "inputs": {"value": 2}},
            "2": {"class_type": "AddViaGraph", "inputs": {"a": ["1", 0], "b": 3, "note": note}},
            "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
        }

    await engine.run_prompt(prompt("first"))
    CALLS.clear()
    sink = Recorder()
    _, result = await engine.run_prompt(prompt("second"), sink=sink)
    assert result is not None and result.outputs["3"]["value"] == [5]
    # The parent ran again and expanded to the same nodes: those came from the cache.
    assert ("2", "2") in executing(sink)
    assert CALLS == []
    assert result.outputs["2.show"] == {"value": [3], "id": ["2.show"]}


async def test_comfyui_graph_builder_gets_each_calls_prefix(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for ComfyUI's comfy_execution.graph_utils, as a node pack would load it.
    class GraphBuilder:
        root, call, graph = "", 0, 0

        @classmethod
        def set_default_prefix(cls, root: str, call: int, graph: int = 0) -> None:
            cls.root, cls.call, cls.graph = root, call, graph

        @classmethod
        def alloc_prefix(cls) -> str:
            prefix = f"{cls.root}.{cls.call}.{cls.graph}."
            cls.graph += 1
            return prefix

    module = types.ModuleType("comfy_execution.graph_utils")
    module.GraphBuilder = GraphBuilder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "comfy_execution.graph_utils", module)
    prompt = {
        "1": {"class_type": "Range", "inputs": {"count": 2}},
        "5": {"class_type": "BuilderUser", "inputs": {"value": ["1", 0]}},
        "6": {"class_type": "Collect", "inputs": {"values": ["5", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs["6"] == {"values": [1, 2]}
    assert {node for node, _ in executing(sink)} >= {"5.0.0.1", "5.1.0.1"}


async def test_interrupting_a_subgraph_reports_the_submitted_node(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "ParallelNaps", "inputs": {"seconds": 5.0}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    handle = RunHandle()
    sink = Recorder()
    run = asyncio.create_task(engine.run_prompt(prompt, sink=sink, handle=handle))
    await asyncio.sleep(0.3)
    handle.interrupt()
    _, result = await asyncio.wait_for(run, 3.0)
    assert result is not None and result.status == "interrupted"
    stopped = sink.messages("execution_interrupted")[0].data
    assert stopped["node_id"] == "1" and stopped["node_type"] == "ParallelNaps"


async def test_object_constants_in_a_subgraph_never_match_in_the_cache(engine: Engine) -> None:
    # The two arrays print the same (numpy elides their middle): only values may match.
    for centre in (1.0, 2.0):
        prompt = {
            "1": {"class_type": "TotalViaGraph", "inputs": {"centre": centre}},
            "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
        }
        _, result = await engine.run_prompt(prompt)
        assert result is not None and result.outputs["2"]["value"] == [centre]
