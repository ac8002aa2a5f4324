"""Graph expansion: a node returns new nodes (`expand`) that join its prompt's run.

ComfyUI's protocol: `{"result": (...), "expand": {node_id: {"class_type", "inputs"}}}`.
The new nodes are API-format nodes whose links may point at any node of the run,
old or new. Of them, output nodes run, and so does whatever `result` links to;
the expanding node completes once those links have values. Expanded nodes may
expand in turn (loops are written as a node that re-expands itself).

The subgraph comes from node code: it is checked (shape, known classes, unique
ids, a bound on the number of nodes a run may add) before any of it joins.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from comfyfleet.engine.calls import CallResult
from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.errors import ComfyfleetError

# Nodes expansions may add to one run: a loop that never ends must end the prompt,
# not the process. Ten thousand iterations of a typical loop fit.
MAX_EXPANDED_NODES = 100_000


class ExpansionError(ComfyfleetError, ValueError):
    """A node returned a subgraph that cannot join the run."""


@dataclass
class PendingExpansion:
    """An expanded node waiting for its subgraph: its calls' results and its `ui`."""

    calls: list[CallResult]
    ui: dict[str, list[Any]]


def add_subgraph(
    dynprompt: DynamicPrompt, registry: NodeRegistry, parent: str, subgraph: Any
) -> list[str]:
    """Check `subgraph` and add its nodes to the run as children of `parent`; their ids."""
    if not isinstance(subgraph, dict):
        raise ExpansionError(f"'expand' must be a dict of nodes, not {type(subgraph).__name__}")
    added = len(dynprompt.nodes) - len(dynprompt.get_original_prompt())
    if added + len(subgraph) > MAX_EXPANDED_NODES:
        raise ExpansionError(f"expansions may add at most {MAX_EXPANDED_NODES} nodes to a prompt")
    nodes = [(i, _checked_node(dynprompt, registry, i, node)) for i, node in subgraph.items()]
    for node_id, node in nodes:
        display = node.get("override_display_id")
        dynprompt.add_ephemeral_node(
            node_id, node, parent, display if isinstance(display, str) else parent
        )
    return [node_id for node_id, _ in nodes]


def _checked_node(
    dynprompt: DynamicPrompt, registry: NodeRegistry, node_id: Any, node: Any
) -> dict[str, Any]:
    """A copy of one new node (later changes to the node's own dict do not reach the run)."""
    if not isinstance(node_id, str):
        raise ExpansionError(f"node ids must be strings, not {type(node_id).__name__}")
    if dynprompt.has_node(node_id):
        raise ExpansionError(f"node id {node_id!r} is already in the prompt: ids must be unique")
    if not isinstance(node, dict):
        raise ExpansionError(f"node {node_id!r} must be a dict, not {type(node).__name__}")
    class_type = node.get("class_type")
    if not isinstance(class_type, str) or class_type not in registry:
        raise ExpansionError(f"node {node_id!r}: node class {class_type!r} does not exist")
    inputs = node.get("inputs", {})
    if not isinstance(inputs, dict):
        raise ExpansionError(f"node {node_id!r}: 'inputs' must be a dict")
    return {**node, "inputs": dict(inputs)}


def use_builder_prefix(node_id: str, call_index: int) -> None:
    """Point ComfyUI's `GraphBuilder`, if a node pack has loaded it, at the calling node.

    Nodes build subgraphs with `GraphBuilder()`, whose node ids start with a prefix
    ComfyUI sets before each call (`{node_id}.{call_index}.{n}.`). That keeps ids
    unique and the same from one run to the next, so expanded nodes can be cached.
    ComfyUI's module is never imported here, only used when already loaded. Its
    prefix is class state shared by concurrent calls; ids stay unique all the same,
    since every builder made bumps the prefix's last part.
    """
    module = sys.modules.get("comfy_execution.graph_utils")
    setter = getattr(getattr(module, "GraphBuilder", None), "set_default_prefix", None)
    if callable(setter):
        setter(node_id, call_index, 0)
