"""What a backend can run, the node union for validation, and affinity scores."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.validation import validate_prompt
from comfyfleet.lanes.affinity import Warmth, model_files
from comfyfleet.lanes.capabilities import Capabilities
from comfyfleet.lanes.remote_nodes import union_registry
from comfyfleet.nodes import build_registry

CHECKPOINT_LOADER = {
    "input": {"required": {"ckpt_name": [["sd15.safetensors", "sdxl.safetensors"], {}]}},
    "output": ["MODEL", "CLIP", "VAE"],
    "output_name": ["MODEL", "CLIP", "VAE"],
    "output_is_list": [False, False, False],
    "output_node": False,
    "category": "loaders",
}
LOAD_IMAGE = {
    "input": {"required": {"image": [["a.png"], {"image_upload": True}]}},
    "output": ["IMAGE", "MASK"],
    "output_node": False,
}
LORA_BY_NAME = {
    "input": {"required": {"model": ["MODEL"], "lora": ["STRING", {}]}},
    "output": ["MODEL"],
    "output_node": False,
}
SINK = {"input": {"required": {"model": ["MODEL"]}}, "output": [], "output_node": True}
INFO = {
    "CheckpointLoaderSimple": CHECKPOINT_LOADER,
    "LoadImage": LOAD_IMAGE,
    "LoraByName": LORA_BY_NAME,
    "ModelSink": SINK,
}


def prompt(ckpt: str = "sdxl.safetensors", lora: str = "detail.safetensors") -> dict[str, Any]:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "LoraByName", "inputs": {"model": ["1", 0], "lora": lora}},
        "3": {"class_type": "ModelSink", "inputs": {"model": ["2", 0]}},
        "4": {"class_type": "LoadImage", "inputs": {"image": "uploaded-here.png"}},
    }


def test_a_backend_with_the_nodes_and_files_can_run_it() -> None:
    caps = Capabilities.from_object_info(INFO, {"loras": ["detail.safetensors"]})
    assert caps.missing_for(prompt()) == []
    assert caps.can_run(prompt())


def test_missing_class_combo_value_and_model_file_are_named() -> None:
    caps = Capabilities.from_object_info(INFO, {"loras": ["other.safetensors"]})
    missing = caps.missing_for(
        {**prompt("flux.safetensors"), "9": {"class_type": "NoSuchNode", "inputs": {}}}
    )
    assert missing == [
        "node #1: ckpt_name 'flux.safetensors' is not available",
        "node #2: model file 'detail.safetensors' is not there",
        "node #9: class NoSuchNode is not installed",
    ]


def test_upload_combos_are_not_checked_and_unknown_model_lists_are_not_guessed() -> None:
    # LoadImage's file list is the backend's input folder: the gateway pushes the file first.
    caps = Capabilities.from_object_info(INFO)  # no model folders read
    assert caps.missing_for(prompt()) == []


async def test_union_registry_validates_remote_only_nodes_with_comfyui_rules() -> None:
    local = build_registry()
    other = {"CheckpointLoaderSimple": {**CHECKPOINT_LOADER}}
    other["CheckpointLoaderSimple"]["input"] = {
        "required": {"ckpt_name": [["flux.safetensors"], {}]}
    }
    registry = union_registry(local, [INFO, other])
    assert "LoadImage" in registry.nodes and registry.get("LoadImage") is local.get("LoadImage")
    assert {"CheckpointLoaderSimple", "LoraByName", "ModelSink"} <= set(registry.nodes)
    ok = await validate_prompt(
        registry, {k: v for k, v in prompt("flux.safetensors").items() if k != "4"}
    )
    assert ok.ok, ok.error
    bad = await validate_prompt(
        registry, {k: v for k, v in prompt("nope.ckpt").items() if k != "4"}
    )
    assert not bad.ok
    assert bad.node_errors["1"]["errors"][0]["type"] == "value_not_in_list"
    options = registry.get("CheckpointLoaderSimple").input_types().get("ckpt_name").type  # type: ignore[union-attr]
    assert options == ["sd15.safetensors", "sdxl.safetensors", "flux.safetensors"]


def test_warmth_prefers_shared_models_then_shared_roots() -> None:
    assert model_files(prompt()) == {"sdxl.safetensors", "detail.safetensors"}
    warm = Warmth.of(prompt())
    cold = Warmth.of(prompt("sd15.safetensors", "x.safetensors"))
    assert warm.score(Warmth.of(prompt())) > cold.score(Warmth.of(prompt()))
    assert cold.score(Warmth.of(prompt()))[0] == 0
    assert Warmth().score(Warmth.of(prompt())) == (0, 0)
