"""What the command line says about a prompt: its size, and why it failed validation."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.validation import ValidationResult
from comfyfleet.protocol.prompt import is_link

#: Problems listed one per line before the JSON body; the rest are counted.
SHOWN_PROBLEMS = 5


def display_names(registry: NodeRegistry) -> dict[str, str | None]:
    return {name: node.display_name for name, node in registry.nodes.items()}


def nodes_to_run(prompt: dict[str, Any], outputs: list[str]) -> int:
    """How many nodes the outputs need (themselves and everything linked upstream)."""
    seen: set[str] = set()
    stack = list(outputs)
    while stack:
        node_id = stack.pop()
        node = prompt.get(node_id)
        if node_id in seen or not isinstance(node, dict):
            continue
        seen.add(node_id)
        inputs = node.get("inputs")
        for value in inputs.values() if isinstance(inputs, dict) else ():
            if is_link(value):
                stack.append(value[0])
    return len(seen)


def validation_summary(
    checked: ValidationResult, prompt: dict[str, Any], registry: NodeRegistry
) -> list[str]:
    """One line per problem, unknown nodes first (with the names they may have meant)."""
    lines = list(_unknown_nodes(prompt, registry))
    for node_id, found in checked.node_errors.items():
        for error in found.get("errors", []):
            class_type = found.get("class_type", "?")
            lines.append(f"#{node_id} {class_type}: {_described(error)}")
    if not lines and checked.error:
        lines.append(_described(checked.error))
    if len(lines) > SHOWN_PROBLEMS:
        more = len(lines) - SHOWN_PROBLEMS
        lines = [*lines[:SHOWN_PROBLEMS], f"... and {more} more (see the JSON below)"]
    return lines


def _unknown_nodes(prompt: dict[str, Any], registry: NodeRegistry) -> Iterator[str]:
    names = list(registry.nodes)
    shown = {node.display_name or name: name for name, node in registry.nodes.items()}
    for node_id, node in prompt.items():
        class_type = node.get("class_type") if isinstance(node, dict) else None
        if not isinstance(class_type, str) or class_type in registry.nodes:
            continue
        close = difflib.get_close_matches(class_type, names, n=3, cutoff=0.7)
        close += [shown[d] for d in difflib.get_close_matches(class_type, list(shown), 3, 0.7)]
        line = f"#{node_id}: there is no node {class_type!r}"
        if close:
            line += "; did you mean " + " or ".join(repr(n) for n in dict.fromkeys(close)) + "?"
        yield line + " (comfyfleet nodes lists them)"


def _described(error: dict[str, Any]) -> str:
    message = str(error.get("message", "")).strip()
    details = str(error.get("details", "")).strip()
    return f"{message}: {details}" if details else message
