"""Input signatures: what makes two node runs interchangeable for the cache.

A node's signature covers its class, its constant inputs, its `IS_CHANGED`
value and, through links, the signatures of everything upstream. Nodes that
are not idempotent, or that ask for their own UNIQUE_ID, also include their id.

Only plain values (JSON's kinds) can be compared: a node an expansion adds may
hold any object as a constant (an image array, a model), and such a value, like
an `IS_CHANGED` of NaN, makes a signature nothing else matches (as in ComfyUI).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Mapping
from typing import Any

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.protocol.prompt import is_link

_PLAIN = (str, bytes, int, float, bool, type(None))


def _stable_repr(value: Any) -> str:
    if isinstance(value, dict):
        items = ", ".join(f"{k!r}: {_stable_repr(v)}" for k, v in sorted(value.items(), key=str))
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_stable_repr(v) for v in value) + "]"
    if isinstance(value, _PLAIN):
        return f"{type(value).__name__}:{value!r}"
    # Any other object: its repr may be shortened (arrays) or hold an address.
    return f"unhashable:{uuid.uuid4().hex}"


def changed_token(value: Any) -> str:
    """`IS_CHANGED` results as a signature part; NaN (ComfyUI's "always") never matches."""
    if isinstance(value, float) and math.isnan(value):
        return uuid.uuid4().hex
    return _stable_repr(value)


def signatures(
    registry: NodeRegistry,
    prompt: Mapping[str, dict[str, Any]],
    node_ids: list[str],
    changed: dict[str, str],
    known: dict[str, str] | None = None,
) -> dict[str, str]:
    """Signatures of `node_ids` and their ancestors (iterative: deep chains are fine),
    added to `known` (returned) so a prompt that grows only signs its new nodes."""
    result: dict[str, str] = {} if known is None else known
    for root in node_ids:
        stack: list[tuple[str, bool]] = [(root, False)]
        on_path: set[str] = set()
        while stack:
            node_id, expanded = stack.pop()
            if node_id in result:
                continue
            # A link to a node not in the prompt (its output failed validation and will
            # not run) is left unsigned: `_signature` makes it match nothing, as in ComfyUI.
            inputs = prompt[node_id].get("inputs", {}).values()
            links = [v[0] for v in inputs if is_link(v) and v[0] in prompt]
            if not expanded:
                on_path.add(node_id)
                stack.append((node_id, True))
                stack.extend((p, False) for p in links if p not in result and p not in on_path)
                continue
            on_path.discard(node_id)
            result[node_id] = _signature(registry, prompt, node_id, result, changed)
    return result


def _signature(
    registry: NodeRegistry,
    prompt: Mapping[str, dict[str, Any]],
    node_id: str,
    known: dict[str, str],
    changed: dict[str, str],
) -> str:
    node = prompt[node_id]
    class_type = node["class_type"]
    parts = [class_type, changed.get(node_id, "")]
    node_def = registry.get(class_type)
    if node_def is not None and (node_def.not_idempotent or node_def.wants_unique_id):
        parts.append(f"id:{node_id}")
    for name in sorted(node.get("inputs", {})):
        value = node["inputs"][name]
        if is_link(value):
            # A link inside a cycle or to a missing node has no signature: make it
            # unique so nothing matches.
            parent = known.get(value[0]) or uuid.uuid4().hex
            parts.append(f"{name}=link:{parent}:{int(value[1])}")
        else:
            parts.append(f"{name}={_stable_repr(value)}")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
