"""Splitting a parent prompt around its fleet nodes, and building its children."""

from __future__ import annotations

import json
from typing import Any

import pytest

from comfyfleet.children.graph import (
    KINDS,
    ChildGraph,
    ChildGraphError,
    ChildGraphTooLarge,
    child_prompts,
    needs_split,
    parse_values,
    result_node,
    split_parent,
)


def parent() -> dict[str, Any]:
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "color": 5}},
        "2": {"class_type": "KSamplerLike", "inputs": {"image": ["1", 0], "seed": 7}},
        "3": {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["2", 0], "count": 3, "vary": "seed"},
        },
        "4": {"class_type": "Collect from the Fleet", "inputs": {"batch": ["3", 0]}},
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
    }


def test_the_parent_keeps_what_is_downstream_and_the_node_holds_what_is_upstream() -> None:
    prompt = parent()
    assert needs_split(prompt)
    own, graphs = split_parent(prompt)
    assert list(own) == ["3", "4", "5"]
    assert "image" not in own["3"]["inputs"] and own["3"]["inputs"]["count"] == 3
    graph = ChildGraph.from_json(own["3"]["inputs"]["graph"])
    assert graph == graphs["3"] and list(graph.nodes) == ["1", "2"] and graph.source == ("2", 0)
    assert not needs_split(own)  # a split parent is split no further
    assert prompt == parent()  # the prompt given is not changed


def test_a_node_the_parent_also_needs_stays_in_the_parent() -> None:
    prompt = parent()
    prompt["6"] = {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}
    own, graphs = split_parent(prompt)
    assert list(own) == ["1", "3", "4", "5", "6"]
    assert list(graphs["3"].nodes) == ["1", "2"]


def test_children_vary_the_named_input_and_end_in_a_preview_of_the_source() -> None:
    _, graphs = split_parent(parent())
    children = child_prompts(graphs["3"], "3", 3, "seed")
    assert [c["2"]["inputs"]["seed"] for c in children] == [7, 8, 9]
    assert [c["1"]["inputs"]["color"] for c in children] == [5, 5, 5]
    assert all(c[result_node("3")]["inputs"]["images"] == ["2", 0] for c in children)
    assert graphs["3"].nodes["2"]["inputs"]["seed"] == 7  # copies, not the graph itself
    wrapped = ChildGraph({"1": {"class_type": "X", "inputs": {"seed": 2**64 - 1}}}, ("1", 0))
    assert [c["1"]["inputs"]["seed"] for c in child_prompts(wrapped, "9", 2, "seed")] == [
        2**64 - 1,
        0,
    ]


@pytest.mark.parametrize(
    ("count", "vary", "message"),
    [
        (0, "seed", "count must be 1 to 64"),
        (65, "seed", "count must be 1 to 64"),
        (2, "nothing", "no node upstream of #3 has an integer input 'nothing'"),
    ],
)
def test_bad_counts_and_inputs_to_vary_say_why(count: int, vary: str, message: str) -> None:
    _, graphs = split_parent(parent())
    with pytest.raises(ChildGraphError, match=message):
        child_prompts(graphs["3"], "3", count, vary)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "{}",
        json.dumps({"nodes": {}, "source": ["1", 0]}),
        json.dumps({"nodes": {"1": {}}, "source": "1"}),
        '{"nodes": 1, "source": 2}',
    ],
)
def test_a_graph_input_that_is_not_a_child_graph_is_refused(text: str) -> None:
    with pytest.raises(ChildGraphError):
        ChildGraph.from_json(text)


def test_an_unlinked_or_dangling_fleet_node_is_left_alone() -> None:
    prompt = parent()
    prompt["3"]["inputs"]["image"] = ["missing", 0]
    own, graphs = split_parent(prompt)
    assert graphs == {} and own["3"]["inputs"]["image"] == ["missing", 0]


def chain(length: int, fleet_nodes: int) -> dict[str, Any]:
    """A chain of `length` nodes, each fleet node running all of it."""
    prompt: dict[str, Any] = {"0": {"class_type": "EmptyImage", "inputs": {"seed": 1}}}
    for n in range(1, length):
        prompt[str(n)] = {"class_type": "Blur", "inputs": {"image": [str(n - 1), 0]}}
    for f in range(fleet_nodes):
        prompt[f"f{f}"] = {
            "class_type": "Run on the Fleet",
            "inputs": {"image": [str(length - 1), 0], "count": 2, "vary": "seed"},
        }
    return prompt


def test_a_long_chain_is_cut_once_in_one_walk() -> None:
    own, graphs = split_parent(chain(20_000, 1), 25_000)
    assert list(own) == ["f0"] and len(graphs["f0"].nodes) == 20_000
    assert list(graphs["f0"].nodes)[:3] == ["0", "1", "2"]


def test_graphs_held_past_the_prompt_limit_are_refused_before_they_are_built() -> None:
    with pytest.raises(ChildGraphTooLarge):
        split_parent(chain(10_000, 3), 25_000)  # three copies of 10,000 nodes
    split_parent(chain(10_000, 2), 25_000)  # two: within


def test_a_prompt_holds_at_most_64_fleet_nodes() -> None:
    with pytest.raises(ChildGraphError, match="at most 64 fleet nodes"):
        split_parent(chain(3, 65))
    assert len(split_parent(chain(3, 64))[1]) == 64


def test_values_give_one_child_each_on_any_literal_input() -> None:
    _, graphs = split_parent(parent())
    children = child_prompts(graphs["3"], "3", 1, "color", parse_values('[1, 2.5, "x"]'))
    assert [c["1"]["inputs"]["color"] for c in children] == [1, 2.5, "x"]
    with pytest.raises(ChildGraphError, match="no node upstream of #3 has an input 'cfg'"):
        child_prompts(graphs["3"], "3", 1, "cfg", [1])


@pytest.mark.parametrize("text", ["[", "{}", "[]", "[[1]]", json.dumps(list(range(65)))])
def test_bad_values_say_why(text: str) -> None:
    with pytest.raises(ChildGraphError, match="values must"):
        parse_values(text)
    assert parse_values("  ") is None


@pytest.mark.parametrize(
    "node",
    [
        {"class_type": ["Run on the Fleet"], "inputs": {"image": ["1", 0]}},
        {"class_type": "Run on the Fleet", "inputs": ["image"]},
        {"class_type": "Run on the Fleet"},
        "not a node",
    ],
)
def test_any_shape_a_client_sends_is_left_to_validation(node: Any) -> None:
    prompt = {"1": {"class_type": "EmptyImage", "inputs": {}}, "2": node}
    assert not needs_split(prompt)
    assert split_parent(prompt) == (prompt, {})


def test_an_output_index_that_is_not_whole_is_refused() -> None:
    prompt = parent()
    prompt["3"]["inputs"]["image"] = ["2", float("nan")]
    with pytest.raises(ChildGraphError, match="not a whole number"):
        split_parent(prompt)


@pytest.mark.parametrize(
    ("linked", "kind", "ending", "listed_as"),
    [
        (
            "image",
            "image",
            {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
            "images",
        ),
        (
            "latent",
            "latent",
            {
                "class_type": "SaveLatent",
                "inputs": {"filename_prefix": "fleet/child", "samples": ["2", 0]},
            },
            "latents",
        ),
        (
            "video",
            "video",
            {
                "class_type": "SaveVideo",
                "inputs": {
                    "filename_prefix": "fleet/child",
                    "format": "auto",
                    "codec": "auto",
                    "video": ["2", 0],
                },
            },
            "images",
        ),
    ],
)
def test_the_linked_input_says_what_the_children_make_and_keep(
    linked: str, kind: str, ending: dict[str, Any], listed_as: str
) -> None:
    prompt = parent()
    prompt["3"]["inputs"][linked] = prompt["3"]["inputs"].pop("image")
    own, graphs = split_parent(prompt)
    assert linked not in own["3"]["inputs"]
    graph = ChildGraph.from_json(own["3"]["inputs"]["graph"])
    assert graph.kind == kind == graphs["3"].kind
    child = child_prompts(graph, "3", 1, "seed")[0]
    assert child[result_node("3")] == ending
    assert KINDS[kind].listed_as == listed_as


def test_a_fleet_node_with_two_inputs_linked_is_refused() -> None:
    prompt = parent()
    prompt["3"]["inputs"]["latent"] = ["1", 0]
    with pytest.raises(ChildGraphError, match=r"#3: link its image or latent or video, not 2"):
        split_parent(prompt)


@pytest.mark.parametrize("kind", ["audio", 7, None])
def test_a_graph_input_of_an_unknown_kind_is_refused(kind: Any) -> None:
    text = json.dumps({"nodes": {"1": {}}, "source": ["1", 0], "kind": kind})
    with pytest.raises(ChildGraphError, match="results are image, latent, video"):
        ChildGraph.from_json(text)
    old = json.dumps({"nodes": {"1": {}}, "source": ["1", 0]})  # kept before kinds: images
    assert ChildGraph.from_json(old).kind == "image"
