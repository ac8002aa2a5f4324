"""Concurrent Submit twins: minted at start-up with the original's inputs and checks."""

from __future__ import annotations

import inspect
import json
import textwrap
from typing import Any

import pytest

from comfyfleet.engine.nodedef import NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.validation import validate_prompt
from comfyfleet.nodes import build_registry
from comfyfleet.nodes import fanout as fanout_nodes
from comfyfleet.nodes.fanout import SUBMIT_PREFIX

PACK = """
from typing import Any


class Checked:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {
            "size": ("INT", {"default": 8, "min": 1, "max": 64}),
            "mode": (["a", "b"],),
            "label": ("STRING", {"default": ""}),
        }}

    RETURN_TYPES = ("IMAGE", "INT")
    FUNCTION = "run"
    CATEGORY = "test"

    @classmethod
    def VALIDATE_INPUTS(cls, label):
        return True if label != "bad" else "label may not be bad"

    def run(self, size, mode, label):
        raise NotImplementedError


class Clip:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"seconds": ("FLOAT", {"default": 1.0})}}

    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "run"


class Private:
    CONCURRENT_SUBMIT = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


NODE_CLASS_MAPPINGS = {"Checked": Checked, "Clip": Clip, "Private": Private}
NODE_DISPLAY_NAME_MAPPINGS = {"Checked": "Checked Image"}
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> NodeRegistry:
    root = tmp_path_factory.mktemp("custom_nodes")
    (root / "twin_pack.py").write_text(textwrap.dedent(PACK))
    return build_registry(testing=True, custom_nodes=[root])


def test_every_image_and_video_node_gets_a_twin_unless_it_opts_out(
    registry: NodeRegistry,
) -> None:
    assert not registry.failures
    for name in ("EmptyImage", "LoadImage", "BFLFluxImage", "OpenAIImage", "Checked", "Clip"):
        assert SUBMIT_PREFIX + name in registry, name
    for name in ("SaveImage", "APISettings", "Private", "Sleep", "Concurrent Collect Images (30)"):
        assert SUBMIT_PREFIX + name not in registry, name
    assert not any(n.startswith(SUBMIT_PREFIX + SUBMIT_PREFIX) for n in registry.nodes)


def test_a_twin_has_the_same_widgets_and_a_task_output(registry: NodeRegistry) -> None:
    for name in ("BFLFluxImage", "Checked"):
        original = registry.nodes[name].object_info()
        twin = registry.nodes[SUBMIT_PREFIX + name].object_info()
        assert json.dumps(twin["input"]) == json.dumps(original["input"])
        assert twin["input_order"] == original["input_order"]
        assert twin["output"] == ["IMAGE_FUTURE"] and twin["output_name"] == ["task"]
        assert twin["output_node"] is False
    clip = registry.nodes[SUBMIT_PREFIX + "Clip"].object_info()
    assert clip["output"] == ["VIDEO_FUTURE"]
    checked = registry.nodes[SUBMIT_PREFIX + "Checked"]
    assert checked.display_name == SUBMIT_PREFIX + "Checked Image"
    assert registry.nodes["Checked"].cls.__dict__.get("RETURN_TYPES") == ("IMAGE", "INT")


def test_input_types_are_a_deep_copy(registry: NodeRegistry) -> None:
    twin = registry.nodes[SUBMIT_PREFIX + "Checked"]
    twin.input_types().raw["required"]["mode"][0].append("c")
    assert registry.nodes["Checked"].input_types().raw["required"]["mode"][0] == ["a", "b"]


def test_validate_inputs_keeps_the_original_signature(registry: NodeRegistry) -> None:
    original, twin = registry.nodes["Checked"], registry.nodes[SUBMIT_PREFIX + "Checked"]
    assert twin.validate_args == original.validate_args == ("label",)
    assert twin.validate_has_kwargs is original.validate_has_kwargs is False
    assert twin.validate_fn is not None and original.validate_fn is not None
    assert inspect.signature(twin.validate_fn) == inspect.signature(original.validate_fn)


def _checked(class_type: str, **inputs: Any) -> dict[str, Any]:
    values = {"size": 8, "mode": "a", "label": "ok", **inputs}
    return {
        "1": {"class_type": class_type, "inputs": values},
        "2": {
            "class_type": "Concurrent Collect Images (30)",
            "inputs": {"task_1": ["1", 0], "failure_mode": "fail_fast"},
        },
    }


@pytest.mark.parametrize(
    ("inputs", "error"),
    [
        ({"size": 100}, "value_bigger_than_max"),
        ({"mode": "z"}, "value_not_in_list"),
        ({"label": "bad"}, "custom_validation_failed"),
    ],
)
async def test_built_in_checks_stay_on_for_the_twin(
    registry: NodeRegistry, inputs: dict[str, Any], error: str
) -> None:
    checked = await validate_prompt(registry, _checked(SUBMIT_PREFIX + "Checked", **inputs))
    assert not checked.ok
    assert [e["type"] for e in checked.node_errors["1"]["errors"]] == [error]
    assert (await validate_prompt(registry, _checked(SUBMIT_PREFIX + "Checked"))).ok


async def test_a_task_wired_into_save_image_is_a_type_mismatch(registry: NodeRegistry) -> None:
    prompt = {
        "1": {
            "class_type": SUBMIT_PREFIX + "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}},
    }
    checked = await validate_prompt(registry, prompt)
    assert not checked.ok
    [problem] = checked.node_errors["2"]["errors"]
    assert problem["type"] == "return_type_mismatch"
    assert problem["extra_info"]["received_type"] == "IMAGE_FUTURE"


def test_collectors_have_fixed_slots_and_are_output_nodes(registry: NodeRegistry) -> None:
    images = registry.nodes["Concurrent Collect Images (30)"].object_info()
    assert images["output_node"] is True
    assert images["input_order"]["required"] == ["task_1", "failure_mode"]
    assert images["input_order"]["optional"] == [f"task_{n}" for n in range(2, 31)]
    assert images["output_name"] == [f"image_{n}" for n in range(1, 31)] + ["status"]
    assert images["output"] == ["IMAGE"] * 30 + ["STRING"]
    videos = registry.nodes["Concurrent Collect Videos (10)"].object_info()
    assert videos["output"] == ["VIDEO"] * 10 + ["STRING"]
    assert videos["input"]["required"]["task_1"] == ["VIDEO_FUTURE", {}]


def test_the_flux_node_has_the_documented_widgets(registry: NodeRegistry) -> None:
    info = registry.nodes["BFLFluxImage"].object_info()
    names = info["input_order"]["required"] + info["input_order"]["optional"]
    expected = ["prompt", "resolution", "aspect_ratio", "grounding", "safety_tolerance"]
    expected += [f"image{n}" for n in range(1, 11)] + ["skip_error", "seed", "model", "api_config"]
    assert sorted(names) == sorted(expected)
    assert info["output"] == ["IMAGE"]
    settings = registry.nodes["APISettings"].object_info()
    assert settings["output"] == ["API_CONFIG"] and settings["output_name"] == ["api_config"]


def test_a_twin_that_cannot_be_minted_is_reported_and_others_still_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = fanout_nodes.mint_twin

    def picky(node: NodeDef) -> type:
        if node.name == "ImageInvert":
            raise RuntimeError("cannot copy this one")
        return real(node)

    monkeypatch.setattr(fanout_nodes, "mint_twin", picky)
    registry = build_registry()
    assert SUBMIT_PREFIX + "ImageInvert" not in registry
    assert SUBMIT_PREFIX + "EmptyImage" in registry
    [failure] = registry.failures
    assert failure.pack == "fanout" and "ImageInvert" in failure.error
