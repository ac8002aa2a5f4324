"""Stand-ins for nodes only backends have: never stricter than the backend."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.validation import validate_prompt
from comfyfleet.lanes.remote_nodes import union_registry
from comfyfleet.nodes import build_registry

#: A backend's node as its /object_info shows it: nothing says whether its own
#: VALIDATE_INPUTS takes `input2` (ComfyUI's TestCustomValidation5 does, via **kwargs).
INFO = {
    "Limited": {
        "input": {
            "required": {
                "input2": ["FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0}],
                "mode": [["a", "b"], {}],
            }
        },
        "input_order": {"required": ["input2", "mode"]},
        "output": ["FLOAT"],
        "output_name": ["FLOAT"],
        "output_is_list": [False],
        "output_node": True,
        "name": "Limited",
        "display_name": "Limited",
        "category": "backend",
        "description": "",
        "python_module": "custom_nodes.backend",
    }
}


def prompt(value: Any, mode: str) -> dict[str, Any]:
    return {"1": {"class_type": "Limited", "inputs": {"input2": value, "mode": mode}}}


async def test_a_stand_in_leaves_min_and_max_to_the_backend() -> None:
    registry = union_registry(build_registry(), [INFO])
    checked = await validate_prompt(registry, prompt(5.0, "a"))
    assert checked.ok, checked.node_errors
    assert checked.outputs == ["1"]
    # The limits are still shown (an editor draws its widgets from them).
    spec = registry.object_info("Limited")["Limited"]["input"]["required"]["input2"]
    assert spec[1]["max"] == 1.0


async def test_a_stand_in_still_checks_what_object_info_tells() -> None:
    registry = union_registry(build_registry(), [INFO])
    checked = await validate_prompt(registry, prompt(0.5, "c"))
    assert not checked.ok
    [problem] = checked.node_errors["1"]["errors"]
    assert problem["type"] == "value_not_in_list"
    converted = await validate_prompt(registry, prompt("not a number", "a"))
    assert converted.node_errors["1"]["errors"][0]["type"] == "invalid_input_type"
