"""A prompt's paid jobs read from its graph: counted, shared, priced, or not known."""

from __future__ import annotations

from typing import Any

import pytest

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.nodes import build_registry
from comfyfleet.spend.estimate import estimate
from comfyfleet.spend.prices import PriceTable
from tests.integration.fanout.conftest import Graph


@pytest.fixture(scope="module")
def registry() -> NodeRegistry:
    return build_registry(testing=True)


def planned(graph: Graph, outputs: list[str], registry: NodeRegistry) -> dict[str, Any]:
    return estimate(graph.prompt, outputs, registry, PriceTable()).as_json()


def test_each_submit_is_one_job_and_equal_submits_share_one(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    tasks = [graph.submit(f"s{n}", "a cat", n) for n in range(4)]
    tasks.append(graph.submit("again", "a cat", 0))  # s0's inputs: s0's job
    graph.collect("c", tasks)
    graph.submit("unused", "a dog", 9)  # nothing waits for it: it never runs
    body = planned(graph, ["c"], registry)
    assert body["paid_jobs"] == 4 and body["count_known"]
    assert body["cost"] == pytest.approx(4 * 0.03)
    [group] = body["jobs"]
    assert (group["provider"], group["model"], group["count"]) == ("bfl", "flux-2-pro", 4)
    assert sorted(group["nodes"]) == ["again", "s0", "s1", "s2", "s3"]


def test_settings_nodes_with_equal_inputs_ask_for_the_same_job(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    twin = graph.api("http://127.0.0.1:1", graph.prompt[graph.settings]["inputs"]["api_key"])
    graph.submit("s1", "a cat", 1)
    graph.submit("s2", "a cat", 1, settings=twin)
    graph.collect("c", ["s1", "s2"])
    assert planned(graph, ["c"], registry)["paid_jobs"] == 1


def test_serial_nodes_and_models_are_counted_by_model(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    graph.submit("s1", "a cat", 1, model="flux-pro-1.1")
    graph.collect("c", ["s1"])
    graph.prompt["serial"] = {
        "class_type": "BFLFluxImage",
        "inputs": graph.flux_inputs("a dog", 2, model="flux-dev"),
    }
    graph.save("out", "serial", 0)
    body = planned(graph, ["c", "out"], registry)
    models = {job["model"]: (job["count"], job["cost"]) for job in body["jobs"]}
    assert models == {"flux-pro-1.1": (1, 0.04), "flux-dev": (1, 0.025)}
    assert body["cost"] == pytest.approx(0.065)


def test_a_submit_fed_a_list_is_not_counted(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    graph.prompt["img"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 8, "height": 8, "batch_size": 3, "color": 0},
    }
    graph.prompt["list"] = {
        "class_type": "RebatchImages",
        "inputs": {"images": ["img", 0], "batch_size": 1},
    }
    graph.prompt["scaled"] = {  # a list passes through nodes that take one item at a time
        "class_type": "ImageInvert",
        "inputs": {"image": ["list", 0]},
    }
    graph.submit("fed", "a cat", 1, image1=["scaled", 0], model="flux-kontext-pro")
    graph.submit("plain", "a cat", 2)
    graph.collect("c", ["fed", "plain"])
    body = planned(graph, ["c"], registry)
    assert not body["count_known"] and body["uncounted_nodes"] == ["fed"]
    assert body["paid_jobs"] == 1  # the others are still counted


def test_a_model_through_a_link_has_no_cost_yet(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    graph.prompt["name"] = {"class_type": "PrimitiveString", "inputs": {"value": "flux-dev"}}
    graph.submit("s1", "a cat", 1, model=["name", 0])
    graph.collect("c", ["s1"])
    estimate_ = estimate(graph.prompt, ["c"], registry, PriceTable())
    assert estimate_.known and not estimate_.costs_known
    body = estimate_.as_json()
    assert body["paid_jobs"] == 1 and body["cost"] is None and body["unpriced_jobs"] == 1


def test_a_video_costs_its_seconds(registry: NodeRegistry) -> None:
    graph = Graph("http://127.0.0.1:1")
    inputs = {
        "prompt": "waves",
        "model": "sora-2",
        "seconds": "8",
        "size": "1280x720",
        "seed": 1,
        "api_config": [graph.settings, 0],
    }
    graph.prompt["v"] = {"class_type": "Concurrent Submit | OpenAIVideo", "inputs": inputs}
    graph.prompt["c"] = {
        "class_type": "Concurrent Collect Videos (10)",
        "inputs": {"task_1": ["v", 0], "failure_mode": "fail_fast"},
    }
    body = planned(graph, ["c"], registry)
    assert body["jobs"][0]["model"] == "sora-2"
    assert body["cost"] == pytest.approx(0.8)


def test_a_request_made_from_the_prompt_alone_has_its_hash(registry: NodeRegistry) -> None:
    from comfyfleet.fanout.request import ApiConfig
    from comfyfleet.nodes.providers.bfl.nodes import BFLFluxImage

    graph = Graph("http://127.0.0.1:1")
    graph.submit("s1", "a cat", 1)
    typed = graph.api("http://127.0.0.1:1", "sk-typed-into-the-workflow")
    graph.submit("s2", "a cat", 2, settings=typed)  # a typed key: a marker only once stored
    graph.prompt["img"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
    }
    graph.submit("s3", "a cat", 3, image1=["img", 0])  # an image: made as it runs
    graph.collect("c", ["s1", "s2", "s3"])
    jobs = {
        job.node_ids[0]: job for job in estimate(graph.prompt, ["c"], registry, PriceTable()).jobs
    }
    inputs = {
        **graph.flux_inputs("a cat", 1),
        "api_config": ApiConfig("http://127.0.0.1:1", "env:FANOUT_TEST_KEY"),
    }
    assert jobs["s1"].request_hash == BFLFluxImage().remote_request(**inputs).request_hash
    assert jobs["s2"].request_hash is None
    assert jobs["s3"].request_hash is None
