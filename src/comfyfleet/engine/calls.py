"""Calling node functions the way ComfyUI does: inputs as lists, one call per index.

Every input value is a list (a constant is a one-item list; a linked output
may hold many items). Unless the class sets INPUT_IS_LIST, the function is
called once per index of the longest list, shorter lists repeating their last
item. Results are merged per output: OUTPUT_IS_LIST outputs are concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from comfyfleet.engine.blocker import Blocker, is_blocker
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.protocol.prompt import Prompt, is_link

HIDDEN_KINDS = ("PROMPT", "DYNPROMPT", "EXTRA_PNGINFO", "UNIQUE_ID")


class GraphExpansionUnsupported(RuntimeError):
    """A node returned `expand` (a subgraph); the built-in engine runs fixed graphs."""


class DynamicPrompt:
    """What a node asking for the hidden DYNPROMPT input receives."""

    def __init__(self, prompt: Prompt) -> None:
        self._prompt = prompt

    def get_node(self, node_id: str) -> dict[str, Any]:
        return self._prompt[node_id]

    def has_node(self, node_id: str) -> bool:
        return node_id in self._prompt

    def all_node_ids(self) -> set[str]:
        return set(self._prompt)

    def get_original_prompt(self) -> Prompt:
        return self._prompt

    def get_real_node_id(self, node_id: str) -> str:
        return node_id

    def get_display_node_id(self, node_id: str) -> str:
        return node_id

    def get_parent_node_id(self, node_id: str) -> str | None:
        return None


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
    prompt: Prompt,
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
            "PROMPT": prompt,
            "DYNPROMPT": DynamicPrompt(prompt),
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


@dataclass
class NodeResult:
    outputs: list[list[Any]]
    ui: dict[str, list[Any]]


def merge_results(node: NodeDef, returns: list[Any]) -> NodeResult:
    """Turn the per-call returns into per-output lists and one merged `ui`."""
    width = len(node.return_types)
    results: list[tuple[Any, ...]] = []
    uis: list[dict[str, Any]] = []
    for ret in returns:
        if isinstance(ret, dict):
            if "expand" in ret:
                raise GraphExpansionUnsupported(f"{node.name} returned a subgraph ('expand')")
            if isinstance(ret.get("ui"), dict):
                uis.append(ret["ui"])
            if "result" in ret:
                results.append(_as_tuple(node, ret["result"], width))
        else:
            results.append(_as_tuple(node, ret, width))
    outputs: list[list[Any]] = []
    for index in range(width if results else 0):
        if index < len(node.output_is_list) and node.output_is_list[index]:
            merged: list[Any] = []
            for result in results:
                item = result[index]
                merged.extend([item] if is_blocker(item) else item)
            outputs.append(merged)
        else:
            outputs.append([result[index] for result in results])
    ui: dict[str, list[Any]] = {}
    if uis:
        ui = {key: [item for u in uis for item in u.get(key, [])] for key in uis[0]}
    return NodeResult(outputs, ui)


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
