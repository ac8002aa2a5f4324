"""Calling node functions the way ComfyUI does: inputs as lists, one call per index.

Every input value is a list (a constant is a one-item list; a linked output
may hold many items). Unless the class sets INPUT_IS_LIST, the function is
called once per index of the longest list, shorter lists repeating their last
item. Results are merged per output: OUTPUT_IS_LIST outputs are concatenated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.engine.blocker import Blocker, is_blocker
from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.protocol.prompt import is_link

HIDDEN_KINDS = ("PROMPT", "DYNPROMPT", "EXTRA_PNGINFO", "UNIQUE_ID")


@dataclass
class NodeInputs:
    """A node's inputs as lists, plus the lazy links not yet evaluated."""

    values: dict[str, list[Any]] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)


def gather_inputs(
    node_id: str,
    inputs: dict[str, Any],
    types: InputTypes,
    outputs: dict[str, list[list[Any]]],
    dynprompt: DynamicPrompt,
    extra_data: dict[str, Any],
) -> NodeInputs:
    gathered = NodeInputs()
    for name, value in inputs.items():
        info = types.get(name)
        if is_link(value) and not (info and info.options.get("rawLink")):
            produced = outputs.get(value[0])
            index = int(value[1])
            if produced is None or index >= len(produced):
                gathered.missing.add(name)
                gathered.values[name] = [None]
            else:
                gathered.values[name] = produced[index]
        elif info is not None:
            gathered.values[name] = [value]
    for info in types.hidden():
        hidden = {
            "PROMPT": dynprompt.get_original_prompt(),
            "DYNPROMPT": dynprompt,
            "EXTRA_PNGINFO": extra_data.get("extra_pnginfo"),
            "UNIQUE_ID": node_id,
        }
        if info.type in hidden:
            gathered.values[info.name] = [hidden[info.type]]
    return gathered


def call_arguments(values: dict[str, list[Any]], input_is_list: bool) -> list[dict[str, Any]]:
    """The keyword arguments of each call."""
    if input_is_list:
        return [dict(values)]
    longest = max((len(v) for v in values.values()), default=0)
    if longest == 0:
        return [{}]
    return [{k: v[i] if len(v) > i else v[-1] for k, v in values.items()} for i in range(longest)]


def blocker_in(kwargs: dict[str, Any], input_is_list: bool) -> Blocker | None:
    for value in kwargs.values():
        if input_is_list and isinstance(value, list):
            found = next((e for e in value if is_blocker(e)), None)
            if found is not None:
                return found
        elif is_blocker(value):
            return value
    return None


@dataclass(frozen=True)
class CallResult:
    """One call's result tuple. When the call expanded, an entry may be a link into
    the subgraph: it stands for what that output holds once the subgraph has run."""

    values: tuple[Any, ...]
    expanded: bool = False


@dataclass
class NodeReturns:
    """What a node's calls returned: results, subgraphs (`expand`) and one merged `ui`."""

    calls: list[CallResult]
    subgraphs: list[Any]
    ui: dict[str, list[Any]]


def split_returns(node: NodeDef, returns: list[Any]) -> NodeReturns:
    width = len(node.return_types)
    calls: list[CallResult] = []
    subgraphs: list[Any] = []
    uis: list[dict[str, Any]] = []
    for ret in returns:
        if not isinstance(ret, dict):
            calls.append(CallResult(_as_tuple(node, ret, width)))
            continue
        if isinstance(ret.get("ui"), dict):
            uis.append(ret["ui"])
        if "expand" in ret:
            subgraphs.append(ret["expand"])
            calls.append(CallResult(_as_tuple(node, ret.get("result", ()), width), True))
        elif "result" in ret:
            calls.append(CallResult(_as_tuple(node, ret["result"], width)))
    ui: dict[str, list[Any]] = {}
    if uis:
        ui = {key: [item for u in uis for item in u.get(key, [])] for key in uis[0]}
    return NodeReturns(calls, subgraphs, ui)


def merge_outputs(
    node: NodeDef, calls: list[CallResult], linked: Callable[[Any], list[Any]]
) -> list[list[Any]]:
    """Per-output item lists over all calls: OUTPUT_IS_LIST outputs are concatenated.

    `linked(link)` gives the items a linked output holds (an expanded call's link).
    """
    width = len(node.return_types)
    outputs: list[list[Any]] = [[] for _ in range(width)] if calls else []
    for call in calls:
        for index in range(width):
            outputs[index].extend(_items(node, index, call, linked))
    return outputs


def _items(
    node: NodeDef, index: int, call: CallResult, linked: Callable[[Any], list[Any]]
) -> list[Any]:
    value = call.values[index]
    if call.expanded and is_link(value):
        held = linked(value)
        if len(held) != 1:
            return list(held)  # a list output's items, each one item here too
        value = held[0]  # the value, as if the node had returned it (ComfyUI's reading)
    if index < len(node.output_is_list) and node.output_is_list[index] and not is_blocker(value):
        return list(value)
    return [value]


def _as_tuple(node: NodeDef, value: Any, width: int) -> tuple[Any, ...]:
    if is_blocker(value):
        return (value,) * width
    if not isinstance(value, tuple | list):
        raise TypeError(
            f"{node.name}.{node.function_name} returned {type(value).__name__}, "
            f"expected a tuple of {width} output(s)"
        )
    if len(value) < width:
        raise TypeError(
            f"{node.name}.{node.function_name} returned {len(value)} value(s), expected {width}"
        )
    return tuple(value)
