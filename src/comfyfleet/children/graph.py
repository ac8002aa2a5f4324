"""Splitting a parent prompt and building its children: pure functions, no I/O.

A "Run on the Fleet" node's linked `image`, `latent` or `video` input is made by its
children, never by the parent. When the parent is queued, the part upstream of that
input is cut out of it and kept in the node as its `graph` input (JSON: the nodes, the
source link and the kind of result), so the parent is validated, routed and run without
it (`split_parent`). Each child is that part copied, with one integer input varied
(`seed` + i by default) and a node on the source output that keeps the result (a
PreviewImage, SaveLatent or SaveVideo), so that the child's history names the file it
made (`child_prompts`).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any

from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_link

FLEET_CLASS, TILES_CLASS, TILE_CLASS = "Run on the Fleet", "Tiles on the Fleet", "Fleet Tile"
IMAGE, LATENT, VIDEO = "image", "latent", "video"


@dataclass(frozen=True)
class ResultKind:
    """How a child keeps a result of one kind: the node it ends with (`node_class`, its
    result on `input`, `settings` for the rest), and the key under which that node's
    files are listed in the child's history outputs."""

    node_class: str
    input: str
    settings: dict[str, Any]
    listed_as: str


#: Children's outputs are kept in the output folder under this prefix (images: temp).
KEPT_PREFIX = "fleet/child"
KINDS = {
    IMAGE: ResultKind("PreviewImage", "images", {}, "images"),
    LATENT: ResultKind("SaveLatent", "samples", {"filename_prefix": KEPT_PREFIX}, "latents"),
    VIDEO: ResultKind(
        "SaveVideo",
        "video",
        {"filename_prefix": KEPT_PREFIX, "format": "auto", "codec": "auto"},
        "images",
    ),
}
#: Each fleet node class -> its inputs whose upstream its children run (one linked), and
#: the kind of result each stands for.
DELEGATED_INPUTS = {
    FLEET_CLASS: {IMAGE: IMAGE, LATENT: LATENT, VIDEO: VIDEO},
    TILES_CLASS: {"tile": IMAGE},
}
#: Node classes that run where the gateway's queue is, never on a backend: they queue
#: child prompts there (and a Fleet Tile is replaced in every child).
GATEWAY_ONLY_CLASSES = frozenset({*DELEGATED_INPUTS, TILE_CLASS})
#: The input of a fleet node that holds its children's graph.
GRAPH_INPUT = "graph"
#: What a child of a tiles node loads its tile with (a file of the input folder), and
#: what stands for the tile when a child is only validated.
LOAD_CLASS, STAND_IN = (
    "LoadImage",
    {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0},
    },
)
#: extra_data key that names a child's parent: {"prompt_id", "node_id", "index"}.
PARENT_KEY = "comfyfleet_parent"
MAX_CHILDREN = 64
#: Fleet nodes in one prompt: each has its children checked when the prompt is queued.
MAX_FLEET_NODES = 64
#: Seeds and other varied integers wrap here (ComfyUI's largest seed is 2**64 - 1).
WRAP = 2**64


class ChildGraphError(ComfyfleetError, ValueError):
    """A child graph is missing or malformed; the message says why."""


class ChildGraphTooLarge(ChildGraphError):
    """A prompt and the graphs its fleet nodes keep hold too many nodes."""


@dataclass(frozen=True)
class ChildGraph:
    """What a fleet node's children run: `nodes` (a prompt), ending at `source`, whose
    result is of `kind` (a key of KINDS)."""

    nodes: dict[str, Any]
    source: tuple[str, int]
    kind: str = IMAGE

    def to_json(self) -> str:
        return json.dumps({"nodes": self.nodes, "source": list(self.source), "kind": self.kind})

    @property
    def tile_node(self) -> str | None:
        """The Fleet Tile node where each child's tile enters, if there is one."""
        found = [n for n, node in self.nodes.items() if _class(node) == TILE_CLASS]
        return found[0] if len(found) == 1 else None

    @classmethod
    def from_json(cls, text: str) -> ChildGraph:
        try:
            data = json.loads(text)
            nodes, source, kind = data["nodes"], data["source"], data.get("kind", IMAGE)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ChildGraphError(f"the graph input is not a child graph: {exc}") from None
        if not isinstance(nodes, dict) or not is_link(source) or source[0] not in nodes:
            raise ChildGraphError("the graph input is not a child graph")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ChildGraphError(f"a child graph's results are {', '.join(KINDS)}, not {kind!r}")
        return cls(nodes, (source[0], _output_index(source[1])), kind)


def needs_split(prompt: Any) -> bool:
    """Whether `prompt` has a fleet node whose delegated input is linked."""
    return isinstance(prompt, dict) and any(_linked(node) for node in prompt.values())


def split_parent(
    prompt: dict[str, Any], most: int | None = None
) -> tuple[dict[str, Any], dict[str, ChildGraph]]:
    """`prompt` without what only fleet nodes' children run, and each such node's child
    graph (by node id). A node the parent needs elsewhere too stays in the parent.
    ChildGraphTooLarge when the children's graphs hold over `most` nodes together (each
    fleet node keeps a copy of its own): found before that much work is done."""
    graphs: dict[str, ChildGraph] = {}
    parent = dict(prompt)
    order = {node_id: index for index, node_id in enumerate(prompt)}
    budget = most  # the copies the fleet nodes keep, together
    for node_id, node in prompt.items():
        linked = _linked(node)
        if len(linked) > 1:
            names = " or ".join(DELEGATED_INPUTS[str(_class(node))])
            raise ChildGraphError(f"node #{node_id}: link its {names}, not {len(linked)} of them")
        if not linked or linked[0][1][0] not in prompt:
            continue
        delegated, link = linked[0]
        if len(graphs) == MAX_FLEET_NODES:
            raise ChildGraphError(f"a prompt may hold at most {MAX_FLEET_NODES} fleet nodes")
        source = (link[0], _output_index(link[1]))
        upstream = _walk(prompt, [source[0]], budget)
        if budget is not None:
            budget -= len(upstream)
        nodes = {n: prompt[n] for n in sorted(upstream, key=order.__getitem__)}
        kind = DELEGATED_INPUTS[str(_class(node))][delegated]
        graphs[node_id] = graph = ChildGraph(nodes, source, kind)
        if (delegated == "tile") != (graph.tile_node is not None):
            raise ChildGraphError(
                f"node #{node_id}: one Fleet Tile must feed what makes its tile"
                if delegated == "tile"
                else f"node #{node_id}: a Fleet Tile feeds only Tiles on the Fleet"
            )
        inputs = {k: v for k, v in node["inputs"].items() if k != delegated}
        inputs[GRAPH_INPUT] = graph.to_json()
        parent[node_id] = {**node, "inputs": inputs}
    cut = {n for graph in graphs.values() for n in graph.nodes}
    # What the parent still links to stays: one walk from every node not cut.
    kept = _walk(parent, [n for n in parent if n not in cut], None)
    return {n: node for n, node in parent.items() if n in kept}, graphs


def upstream_of(prompt: dict[str, Any], *node_ids: str) -> list[str]:
    """These nodes and every node they depend on through links, in the prompt's order."""
    seen = _walk(prompt, list(node_ids), None)
    return [n for n in prompt if n in seen]


def _walk(prompt: dict[str, Any], roots: list[str], most: int | None) -> set[str]:
    """`roots` and what they link to; ChildGraphTooLarge past `most` nodes."""
    seen: set[str] = set()
    stack = roots
    while stack:
        current = stack.pop()
        if current in seen or current not in prompt:
            continue
        seen.add(current)  # a node of any shape: validation says what is wrong with it
        if most is not None and len(seen) > most:
            raise ChildGraphTooLarge("the children's graphs hold more nodes than a prompt may")
        stack.extend(str(v[0]) for v in _inputs(prompt[current]).values() if is_link(v))
    return seen


def child_prompts(
    graph: ChildGraph, node_id: str, count: int, vary: str, values: list[Any] | None = None
) -> list[dict[str, Any]]:
    """Copies of `graph`, each ending in a PreviewImage of the source: `count` of them,
    the integer input `vary` of each of its nodes set to its value + i in the i-th (i from
    0); or with `values`, one per value, the input `vary` (any literal) set to it."""
    if values is not None:
        return _with_values(graph, node_id, vary, values)
    if not 1 <= count <= MAX_CHILDREN:
        raise ChildGraphError(f"count must be 1 to {MAX_CHILDREN}, not {count}")
    varied = [n for n, node in graph.nodes.items() if _is_int(_inputs(node).get(vary))]
    if count > 1 and not varied:
        raise ChildGraphError(f"no node upstream of #{node_id} has an integer input {vary!r}")
    children = []
    for index in range(count):
        child = _ending(graph, node_id)
        for n in varied:
            child[n]["inputs"][vary] = (child[n]["inputs"][vary] + index) % WRAP
        children.append(child)
    return children


def parse_values(text: str) -> list[Any] | None:
    """A `values` input: None when empty, else a JSON list of 1 to MAX_CHILDREN strings,
    numbers or booleans."""
    if not text.strip():
        return None
    try:
        values = json.loads(text)
    except ValueError:
        raise ChildGraphError("values must be a JSON list, such as [7, 7.5, 8]") from None
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_CHILDREN:
        raise ChildGraphError(f"values must be a JSON list of 1 to {MAX_CHILDREN} values")
    if not all(isinstance(v, str | int | float | bool) for v in values):
        raise ChildGraphError("values must be strings, numbers or booleans")
    return values


def _with_values(
    graph: ChildGraph, node_id: str, vary: str, values: list[Any]
) -> list[dict[str, Any]]:
    given = [n for n, node in graph.nodes.items() if _is_literal(_inputs(node).get(vary, []))]
    if not given:
        raise ChildGraphError(f"no node upstream of #{node_id} has an input {vary!r} to set")
    children = []
    for value in values:
        child = _ending(graph, node_id)
        for n in given:
            child[n]["inputs"][vary] = value
        children.append(child)
    return children


def _ending(graph: ChildGraph, node_id: str) -> dict[str, Any]:
    """A copy of `graph` ending in the node that keeps its source's result."""
    child = copy.deepcopy(graph.nodes)
    kind = KINDS[graph.kind]
    inputs = {**kind.settings, kind.input: list(graph.source)}
    child[result_node(node_id)] = {"class_type": kind.node_class, "inputs": inputs}
    return child


def tile_prompts(graph: ChildGraph, node_id: str, files: list[str | None]) -> list[dict[str, Any]]:
    """A child per tile: `graph` with its Fleet Tile loading that tile from the input
    folder (a stand-in image for None: a child only validated), ending in a PreviewImage
    of the source."""
    tile = graph.tile_node
    if tile is None:
        raise ChildGraphError(f"node #{node_id}: one Fleet Tile must feed what makes its tile")
    children = []
    for name in files:
        child = _ending(graph, node_id)
        loader = {"class_type": LOAD_CLASS, "inputs": {"image": name}}
        child[tile] = copy.deepcopy(STAND_IN) if name is None else loader
        children.append(child)
    return children


def probe_child(graph: ChildGraph, node_id: str) -> dict[str, Any]:
    """A child of `graph` to validate when its parent is queued."""
    if graph.tile_node is not None:
        return tile_prompts(graph, node_id, [None])[0]
    return child_prompts(graph, node_id, 1, "")[0]


def result_node(node_id: str) -> str:
    """The id of the node that keeps a child's result (see `_ending`)."""
    return f"fleet_result_{node_id}"


def _output_index(value: float) -> int:
    """A link's output index as an int; ChildGraphError unless it is a whole number."""
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ChildGraphError(f"a link names output {value!r}, not a whole number")
    return int(value)


def _linked(node: Any) -> list[tuple[str, Any]]:
    """(name, link) of each delegated input of a fleet node that is linked."""
    inputs = _inputs(node)
    names = DELEGATED_INPUTS.get(_class(node) or "", {})
    return [(name, inputs[name]) for name in names if is_link(inputs.get(name))]


def _class(node: Any) -> str | None:
    """A node's class_type when it is one (a client may send anything there)."""
    found = node.get("class_type") if isinstance(node, dict) else None
    return found if isinstance(found, str) else None


def _inputs(node: Any) -> dict[str, Any]:
    inputs = node.get("inputs") if isinstance(node, dict) else None
    return inputs if isinstance(inputs, dict) else {}


def _is_literal(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
