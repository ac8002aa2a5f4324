"""Node classes known only from a backend's `/object_info`, for validation here.

The gateway validates every prompt with ComfyUI's rules before queueing it.
For nodes that only backends have, it builds a stand-in class from their
object_info (inputs, outputs, output node flag); the stand-in validates what
object_info tells (types, links, combo values, but not min/max) and never runs
here. A backend with the companion pack validates such prompts itself. When
several backends offer a class, combo options are the union of theirs (a prompt
then only goes to a backend that has the value).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from comfyfleet.engine.registry import NodeRegistry


class RemoteOnlyNode:
    """Base of the stand-ins: running one here is a routing bug, said plainly.

    A stand-in never checks min/max: object_info cannot tell whether the node's own
    VALIDATE_INPUTS takes an input (ComfyUI then skips those checks), and the gateway
    must never refuse what its backend accepts. The backend checks them."""

    FUNCTION = "run_remote"
    RANGES_CHECKED_ELSEWHERE = True

    def run_remote(self, **_inputs: Any) -> tuple[Any, ...]:
        raise RuntimeError(f"{type(self).__name__} runs on a ComfyUI backend only")


def _merge_combos(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for section in ("required", "optional"):
        ours = merged.get(section) or {}
        for name, spec in (extra.get(section) or {}).items():
            mine = ours.get(name)
            if isinstance(mine, list) and isinstance(spec, list) and mine and spec:
                if isinstance(mine[0], list) and isinstance(spec[0], list):
                    mine[0] = mine[0] + [o for o in spec[0] if o not in mine[0]]
            elif mine is None:
                ours[name] = copy.deepcopy(spec)
        if ours:
            merged[section] = ours
    return merged


def stand_in(class_type: str, info: dict[str, Any]) -> type:
    inputs = copy.deepcopy(info.get("input") or {})

    def input_types(_cls: type) -> dict[str, Any]:
        return copy.deepcopy(inputs)

    attrs: dict[str, Any] = {
        "INPUT_TYPES": classmethod(input_types),
        "RETURN_TYPES": tuple(info.get("output") or ()),
        "RETURN_NAMES": tuple(info.get("output_name") or info.get("output") or ()),
        "OUTPUT_IS_LIST": tuple(info.get("output_is_list") or ()),
        "OUTPUT_NODE": bool(info.get("output_node")),
        "CATEGORY": info.get("category", ""),
        "DESCRIPTION": info.get("description", ""),
    }
    return type(class_type, (RemoteOnlyNode,), attrs)


def union_registry(local: NodeRegistry, remotes: Iterable[dict[str, Any]]) -> NodeRegistry:
    """Local nodes plus stand-ins for every class only backends have."""
    merged: dict[str, dict[str, Any]] = {}
    for object_info in remotes:
        for class_type, info in object_info.items():
            if class_type in local.nodes or not isinstance(info, dict):
                continue
            if class_type in merged:
                merged[class_type] = {
                    **merged[class_type],
                    "input": _merge_combos(
                        merged[class_type].get("input") or {}, info.get("input") or {}
                    ),
                }
            else:
                merged[class_type] = info
    registry = NodeRegistry(
        nodes=dict(local.nodes),
        failures=list(local.failures),
        builtin_names=set(local.builtin_names),
    )
    registry.add_pack(
        {name: stand_in(name, info) for name, info in merged.items()},
        {name: info.get("display_name") for name, info in merged.items()},
        pack="backends",
        python_module={name: info.get("python_module", "backend") for name, info in merged.items()},
        builtin=True,
    )
    return registry
