"""Prompt validation: ComfyUI's rules and shapes, cycles, and robustness."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.validation import ValidationResult, types_compatible, validate_prompt
from comfyfleet.protocol.prompt import LARGE_PROMPT_NODES

# --- node classes --------------------------------------------------------------------


class Source:
    calls = 0

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        cls.calls += 1
        return {
            "required": {"width": ("INT", {"default": 8, "min": 1, "max": 100})},
            "optional": {"mode": (["a", "b", "c"],), "scale": ("FLOAT", {"min": 0.5})},
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class IntSource:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {}}

    RETURN_TYPES = ("INT", "COMBO", ["x", "y"], "*", "IMAGE,MASK")
    FUNCTION = "run"


class Invert:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class LazyPick:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"first": ("IMAGE", {"lazy": True})},
            "optional": {"second": ("IMAGE", {"lazy": True})},
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class Sink:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"images": ("IMAGE", {"tooltip": "in"})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True


class AnySink:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*",)}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True


class Widgets:
    """Every constant type, a long combo and a combo fed by links."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "number": ("FLOAT", {"min": 0.0, "max": 1.0}),
                "text": ("STRING", {}),
                "flag": ("BOOLEAN", {}),
                "choice": ([f"option{i}" for i in range(25)],),
            },
            "optional": {
                "pick": (["x", "y"],),
                "kind": ("COMBO", {"options": ["p", "q"]}),
                "many": ("IMAGE,MASK",),
                "blob": ("*",),
            },
        }

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True


class TypesValidated:
    """VALIDATE_INPUTS taking input_types: link types are its business."""

    seen: list[dict[str, Any]] = []

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": ("IMAGE",), "count": ("INT", {"min": 5})}}

    @classmethod
    def VALIDATE_INPUTS(cls, image: Any, count: int, input_types: dict[str, Any]) -> Any:
        cls.seen.append({"image": image, "count": count, "input_types": input_types})
        return True if input_types["image"] == "IMAGE" else "wants an image"

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True


class KwargsValidated:
    """VALIDATE_INPUTS(**kwargs): no built-in value checks at all."""

    seen: list[dict[str, Any]] = []

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"count": ("INT", {"min": 5, "max": 6}), "mode": (["a"],)},
            "optional": {"image": ("IMAGE",)},
            "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, **kwargs: Any) -> Any:
        cls.seen.append(kwargs)
        return kwargs["count"] != 13

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True


class AsyncValidated:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"name": ("STRING", {})}}

    @classmethod
    async def VALIDATE_INPUTS(cls, name: str) -> Any:
        await asyncio.sleep(0)
        if name == "boom":
            raise ValueError("async boom")
        return True if name == "good" else f"bad name {name}"

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class ThreadNoting(AsyncValidated):
    """AsyncValidated, noting the thread its INPUT_TYPES and VALIDATE_INPUTS run on."""

    threads: list[tuple[str, int]] = []

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        cls.threads.append(("INPUT_TYPES", threading.get_ident()))
        return super().INPUT_TYPES()

    @classmethod
    async def VALIDATE_INPUTS(cls, name: str) -> Any:
        cls.threads.append(("VALIDATE_INPUTS", threading.get_ident()))
        return await super().VALIDATE_INPUTS(name)


class ListValidated:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("INT", {})}}

    @classmethod
    def VALIDATE_INPUTS(cls, value: Any) -> Any:
        return value == [3]

    INPUT_IS_LIST = True
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class Exploding:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("INT", {})}}

    @classmethod
    def VALIDATE_INPUTS(cls, value: int) -> Any:
        raise RuntimeError(f"cannot check {value}")

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


class BrokenTypes:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        raise ValueError("no inputs today")

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"


def _registry() -> NodeRegistry:
    registry = NodeRegistry()
    classes = [
        Source,
        IntSource,
        Invert,
        LazyPick,
        Sink,
        AnySink,
        Widgets,
        TypesValidated,
        KwargsValidated,
        AsyncValidated,
        ThreadNoting,
        ListValidated,
        Exploding,
    ]
    registry.add_pack({c.__name__: c for c in classes}, pack="test", python_module="tests")
    # BrokenTypes cannot be registered normally (listing its inputs fails), so it is
    # swapped in behind a registered name to reach validation.
    registry.add_pack({"BrokenTypes": Invert}, pack="test", python_module="tests")
    registry.nodes["BrokenTypes"].cls = BrokenTypes
    return registry


REGISTRY = _registry()


def node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {"class_type": class_type, "inputs": inputs}


def chain(**overrides: dict[str, Any]) -> dict[str, Any]:
    """Source -> Invert -> Sink, with nodes replaced or added by id."""
    prompt = {"1": node("Source", width=8), "2": node("Invert", image=["1", 0])}
    prompt["3"] = node("Sink", images=["2", 0])
    prompt.update(overrides)
    return prompt


async def validate(prompt: Any, targets: Any = None) -> ValidationResult:
    return await validate_prompt(REGISTRY, prompt, targets)


def only_error(result: ValidationResult, node_id: str) -> dict[str, Any]:
    errors = result.node_errors[node_id]["errors"]
    assert len(errors) == 1, errors
    return errors[0]  # type: ignore[no-any-return]


# --- whole-prompt errors -------------------------------------------------------------


async def test_valid_prompt() -> None:
    result = await validate(chain())
    assert result == ValidationResult(True, None, ["3"], {}, chain())


@pytest.mark.parametrize("prompt", [[], "x", 3, None, [["1", 0]]])
async def test_prompt_not_an_object(prompt: Any) -> None:
    result = await validate(prompt)
    assert not result.ok
    assert result.error is not None and result.error["type"] == "invalid_prompt"
    assert set(result.error) == {"type", "message", "details", "extra_info"}


async def test_missing_class_type_checked_in_prompt_order() -> None:
    prompt = chain(**{"2": {"inputs": {}}, "9": node("NoSuchNode")})
    result = await validate(prompt)
    assert result.error == {
        "type": "invalid_prompt",
        "message": "Cannot execute because a node is missing the class_type property.",
        "details": "Node ID '#2'",
        "extra_info": {},
    }
    assert result.node_errors == {}


@pytest.mark.parametrize("bad", [5, "x", [1], None])
async def test_node_that_is_not_an_object_misses_its_class_type(bad: Any) -> None:
    result = await validate(chain(**{"2": bad}))
    assert result.error is not None
    assert result.error["message"].endswith("missing the class_type property.")


@pytest.mark.parametrize("class_type", ["NoSuchNode", 7, ["Sink"]])
async def test_unknown_class(class_type: Any) -> None:
    result = await validate(chain(**{"9": {"class_type": class_type, "inputs": {}}}))
    assert result.error == {
        "type": "invalid_prompt",
        "message": f"Cannot execute because node {class_type} does not exist.",
        "details": "Node ID '#9'",
        "extra_info": {},
    }


async def test_no_outputs() -> None:
    result = await validate({"1": node("Source", width=8)})
    assert result.error == {
        "type": "prompt_no_outputs",
        "message": "Prompt has no outputs",
        "details": "",
        "extra_info": {},
    }


async def test_partial_targets() -> None:
    prompt = chain(**{"6": node("Sink", images=["1", 0]), "7": node("Sink", images=["1", 0])})
    assert (await validate(prompt, ["7", "6"])).outputs == ["6", "7"]
    assert (await validate(prompt, ["6", "1", "nope"])).outputs == ["6"]
    empty = await validate(prompt, [])
    assert empty.error is not None and empty.error["type"] == "prompt_no_outputs"
    wrong = await validate(prompt, "6")
    assert wrong.error is not None and wrong.error["type"] == "invalid_prompt"


async def test_partial_targets_skip_invalid_untargeted_outputs() -> None:
    prompt = chain(**{"6": node("Sink", images=["9", 0])})
    result = await validate(prompt, ["3"])
    assert result.ok and result.outputs == ["3"] and result.node_errors == {}


# --- input errors --------------------------------------------------------------------


async def test_required_input_missing_and_optional_absent() -> None:
    result = await validate(chain(**{"2": node("Invert")}))
    assert result.error is not None and result.error["details"] == ""
    assert result.node_errors == {
        "2": {
            "errors": [
                {
                    "type": "required_input_missing",
                    "message": "Required input is missing",
                    "details": "image",
                    "extra_info": {"input_name": "image"},
                }
            ],
            "dependent_outputs": ["3"],
            "class_type": "Invert",
        }
    }


async def test_failed_details_list_the_outputs_own_errors() -> None:
    result = await validate(chain(**{"3": node("Sink")}))
    assert result.error == {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        "details": "Required input is missing: images",
        "extra_info": {},
    }


async def test_bad_linked_input() -> None:
    result = await validate(chain(**{"2": node("Invert", image=["1", 0, 0])}))
    assert only_error(result, "2") == {
        "type": "bad_linked_input",
        "message": "Bad linked input, must be a length-2 list of [node_id, slot_index]",
        "details": "image",
        "extra_info": {
            "input_name": "image",
            "input_config": ["IMAGE", {}],
            "received_value": ["1", 0, 0],
        },
    }


async def test_return_type_mismatch() -> None:
    result = await validate(chain(**{"2": node("Invert", image=["4", 0]), "4": node("IntSource")}))
    assert only_error(result, "2") == {
        "type": "return_type_mismatch",
        "message": "Return type mismatch between linked nodes",
        "details": "image, received_type(INT) mismatch input_type(IMAGE)",
        "extra_info": {
            "input_name": "image",
            "input_config": ["IMAGE", {}],
            "received_type": "INT",
            "linked_node": ["4", 0],
        },
    }
    assert list(result.node_errors) == ["2"]


@pytest.mark.parametrize(
    ("received", "expected", "ok"),
    [
        ("IMAGE", "IMAGE", True),
        ("INT", "IMAGE", False),
        ("IMAGE,MASK", "MASK", True),
        ("STRING, INT", "INT,FLOAT", True),
        ("STRING,BOOLEAN", "INT", False),
        ("*", "IMAGE", True),
        ("IMAGE", "*", True),
        ("COMBO", ["a"], True),
        (["a", "b"], ["a"], True),
        (["a"], "COMBO", True),
        ("INT", ["a"], False),
        ("INT", "COMBO", False),
        ("*", ["a"], True),
        (["a"], "IMAGE", False),
    ],
)
def test_types_compatible(received: Any, expected: Any, ok: bool) -> None:
    assert types_compatible(received, expected) is ok


def test_types_compatible_honours_custom_ne() -> None:
    class AnyType(str):
        def __ne__(self, other: object) -> bool:
            return False

    assert types_compatible(AnyType("whatever"), "IMAGE")
    assert types_compatible("IMAGE", AnyType("whatever"))


async def test_links_into_union_wildcard_and_combo_inputs() -> None:
    widgets = node(
        "Widgets",
        number=0.5,
        text="t",
        flag=True,
        choice="option3",
        pick=["4", 2],
        kind=["4", 1],
        many=["4", 4],
        blob=["4", 0],
    )
    result = await validate({"4": node("IntSource"), "5": widgets})
    assert result.ok, result.node_errors


async def test_invalid_input_type() -> None:
    result = await validate(chain(**{"1": node("Source", width="abc")}))
    assert only_error(result, "1") == {
        "type": "invalid_input_type",
        "message": "Failed to convert an input value to a INT value",
        "details": "width, abc, invalid literal for int() with base 10: 'abc'",
        "extra_info": {
            "input_name": "width",
            "input_config": ["INT", {"default": 8, "min": 1, "max": 100}],
            "received_value": "abc",
            "exception_message": "invalid literal for int() with base 10: 'abc'",
        },
    }


async def test_min_and_max_give_one_error_each_in_declaration_order() -> None:
    result = await validate(chain(**{"1": node("Source", scale=0.1, width=1000)}))
    errors = result.node_errors["1"]["errors"]
    assert [e["type"] for e in errors] == ["value_bigger_than_max", "value_smaller_than_min"]
    assert errors[0]["message"] == "Value 1000 bigger than max of 100"
    assert errors[0]["details"] == "width"
    assert errors[0]["extra_info"] == {
        "input_name": "width",
        "input_config": ["INT", {"default": 8, "min": 1, "max": 100}],
        "received_value": 1000,
    }
    assert errors[1]["message"] == "Value 0.1 smaller than min of 0.5"


async def test_value_not_in_list() -> None:
    result = await validate(chain(**{"1": node("Source", width=8, mode="z")}))
    assert only_error(result, "1") == {
        "type": "value_not_in_list",
        "message": "Value not in list",
        "details": "mode: 'z' not in ['a', 'b', 'c']",
        "extra_info": {
            "input_name": "mode",
            "input_config": [["a", "b", "c"], {}],
            "received_value": "z",
        },
    }


async def test_value_not_in_a_long_list_leaves_the_list_out() -> None:
    result = await validate({"5": node("Widgets", number=0.5, text="", flag=0, choice="nope")})
    assert only_error(result, "5") == {
        "type": "value_not_in_list",
        "message": "Value not in list",
        "details": "choice: 'nope' not in (list of length 25)",
        "extra_info": {"input_name": "choice", "input_config": None, "received_value": "nope"},
    }


async def test_constants_are_converted_and_unwrapped_in_a_copy() -> None:
    prompt = {
        "5": node(
            "Widgets",
            number="0.25",
            text=12,
            flag="",
            choice={"__value__": "option1"},
            blob={"__value__": [1, 2, 3]},
            kind="anything",
        )
    }
    original = copy.deepcopy(prompt)
    result = await validate(prompt)
    assert result.ok, result.node_errors
    assert prompt == original
    assert result.prompt["5"]["inputs"] == {
        "number": 0.25,
        "text": "12",
        "flag": False,
        "choice": "option1",
        "blob": [1, 2, 3],
        "kind": "anything",
    }


async def test_normalized_prompt_keeps_key_order() -> None:
    prompt = {"3": {"inputs": {"images": ["1", 0]}, "_meta": {"title": "t"}, "class_type": "Sink"}}
    prompt["1"] = node("Source", mode="a", width="8")
    result = await validate(prompt)
    assert result.ok
    assert list(result.prompt) == ["3", "1"]
    assert list(result.prompt["3"]) == ["inputs", "_meta", "class_type"]
    assert list(result.prompt["1"]["inputs"].items()) == [("mode", "a"), ("width", 8)]


async def test_inputs_missing_or_not_an_object_count_as_empty() -> None:
    result = await validate({"3": {"class_type": "Sink", "inputs": [1, 2]}})
    assert only_error(result, "3")["type"] == "required_input_missing"
    assert result.prompt["3"]["inputs"] == {}
    result = await validate({"3": {"class_type": "Sink"}})
    assert only_error(result, "3")["type"] == "required_input_missing"


# --- exceptions ----------------------------------------------------------------------


async def test_link_to_a_missing_node_is_recorded_by_the_node_linking_to_it() -> None:
    result = await validate(chain(**{"2": node("Invert", image=["99", 0])}))
    error = only_error(result, "2")
    traceback = error["extra_info"].pop("traceback")
    assert isinstance(traceback, list) and all(isinstance(line, str) for line in traceback)
    assert error == {
        "type": "exception_during_inner_validation",
        "message": "Exception when validating inner node",
        "details": "'99'",
        "extra_info": {
            "input_name": "images",
            "input_config": ["IMAGE", {"tooltip": "in"}],
            "exception_message": "'99'",
            "exception_type": "KeyError",
            "linked_node": ["2", 0],
        },
    }
    assert result.node_errors["2"]["dependent_outputs"] == ["3"]


async def test_exception_in_an_output_node() -> None:
    result = await validate({"3": node("Sink", images=["99", 0])})
    error = only_error(result, "3")
    assert error["type"] == "exception_during_validation"
    assert error["message"] == "Exception when validating node"
    assert error["details"] == "'99'"
    assert set(error["extra_info"]) == {"exception_type", "traceback"}
    assert error["extra_info"]["exception_type"] == "KeyError"
    assert result.error is not None
    assert result.error["details"] == "Exception when validating node: '99'"


@pytest.mark.parametrize(
    ("link", "exception_type"),
    [(["1", 5], "IndexError"), (["1", 0.0], "TypeError"), ([3, 0], "KeyError")],
)
async def test_bad_link_slots_raise_like_comfyui(link: list[Any], exception_type: str) -> None:
    result = await validate(chain(**{"2": node("Invert", image=link)}))
    error = only_error(result, "2")
    assert error["type"] == "exception_during_inner_validation"
    assert error["extra_info"]["exception_type"] == exception_type


async def test_validate_inputs_raising() -> None:
    result = await validate(chain(**{"1": node("Exploding", value=4)}))
    error = only_error(result, "1")
    assert error["type"] == "exception_during_inner_validation"
    assert error["details"] == "cannot check 4"
    assert error["extra_info"]["exception_type"] == "RuntimeError"
    assert error["extra_info"]["input_name"] == "image"
    assert error["extra_info"]["linked_node"] == ["1", 0]


async def test_input_types_raising_is_reported_for_every_use() -> None:
    prompt = chain(**{"1": node("BrokenTypes"), "6": node("Sink", images=["1", 0])})
    result = await validate(prompt)
    assert only_error(result, "1")["details"] == "no inputs today"
    assert result.node_errors["1"]["dependent_outputs"] == ["3", "6"]


async def test_a_node_that_raised_keeps_the_links_it_followed() -> None:
    prompt = chain(**{"2": node("LazyPick", first=["1", 0], second=["99", 0]), "1": node("Source")})
    result = await validate(prompt)
    assert list(result.node_errors) == ["1", "2"]
    assert result.node_errors["1"]["dependent_outputs"] == ["3"]


# --- VALIDATE_INPUTS -----------------------------------------------------------------


async def test_custom_validation_failed() -> None:
    result = await validate(chain(**{"1": node("AsyncValidated", name="nope")}))
    assert only_error(result, "1") == {
        "type": "custom_validation_failed",
        "message": "Custom validation failed for node",
        "details": "name - bad name nope",
        "extra_info": {"input_name": "name"},
    }
    assert (await validate(chain(**{"1": node("AsyncValidated", name="good")}))).ok


async def test_async_validate_inputs_raising() -> None:
    result = await validate(chain(**{"1": node("AsyncValidated", name="boom")}))
    error = only_error(result, "1")
    assert error["type"] == "exception_during_inner_validation"
    assert error["details"] == "async boom"
    assert error["extra_info"]["exception_type"] == "ValueError"


async def test_a_large_prompt_is_validated_off_the_loop_and_its_awaits_run_on_it() -> None:
    prompt: dict[str, Any] = {}
    for i in range(LARGE_PROMPT_NODES):  # with the three below: past the threshold
        name = {0: "nope", 1: "boom"}.get(i, "good")
        prompt[f"a{i}"] = node("ThreadNoting", name=name)
        prompt[f"s{i}"] = node("Sink", images=[f"a{i}", 0])
    ThreadNoting.threads.clear()
    result = await validate(prompt)
    loop_thread = threading.get_ident()
    kinds = {
        kind: {t == loop_thread for k, t in ThreadNoting.threads if k == kind}
        for kind in ("INPUT_TYPES", "VALIDATE_INPUTS")
    }
    assert kinds == {"INPUT_TYPES": {False}, "VALIDATE_INPUTS": {True}}
    assert result.ok and len(result.outputs) == LARGE_PROMPT_NODES - 2
    assert only_error(result, "a0")["details"] == "name - bad name nope"
    assert only_error(result, "a1")["type"] == "exception_during_inner_validation"
    assert only_error(result, "a1")["details"] == "async boom"
    small = await validate({k: prompt[k] for k in ("a0", "s0", "a1", "s1")})
    for found in (small, result):  # the traceback's frames differ by the driver
        found.node_errors["a1"]["errors"][0]["extra_info"].pop("traceback")
    assert small.node_errors == result.node_errors
    assert ("INPUT_TYPES", loop_thread) in ThreadNoting.threads  # small: on the loop


async def test_validate_inputs_with_input_types_skips_the_type_check() -> None:
    TypesValidated.seen.clear()
    prompt = {"4": node("IntSource"), "5": node("TypesValidated", image=["4", 0], count=1)}
    result = await validate(prompt)
    assert TypesValidated.seen == [{"image": None, "count": 1, "input_types": {"image": "INT"}}]
    errors = result.node_errors["5"]["errors"]
    assert [e["details"] for e in errors] == [
        "image - wants an image",
        "count - wants an image",
        "input_types - wants an image",
    ]
    prompt["5"]["inputs"]["image"] = ["1", 0]
    prompt["1"] = node("Source", width=8)
    assert (await validate(prompt)).ok


async def test_validate_inputs_with_kwargs_turns_builtin_checks_off() -> None:
    KwargsValidated.seen.clear()
    prompt = chain(**{"5": node("KwargsValidated", count=99, mode="zzz", image=["1", 0], x=1)})
    result = await validate(prompt)
    assert result.ok and result.outputs == ["3", "5"]
    assert KwargsValidated.seen == [
        {"count": 99, "mode": "zzz", "image": None, "unique_id": "5", "prompt": {}}
    ]
    prompt["5"]["inputs"]["count"] = "13"
    result = await validate(prompt)
    assert [e["details"] for e in result.node_errors["5"]["errors"]] == [
        "count",
        "mode",
        "image",
        "unique_id",
        "prompt",
    ]


async def test_input_is_list_validation_gets_lists() -> None:
    assert (await validate(chain(**{"1": node("ListValidated", value="3")}))).ok
    result = await validate(chain(**{"1": node("ListValidated", value=4)}))
    assert only_error(result, "1")["details"] == "value"


async def test_input_types_called_once_per_class() -> None:
    prompt: dict[str, Any] = {"1": node("Source", width=8)}
    for i in range(2, 12):
        prompt[str(i)] = node("Source", width=i)
        prompt[f"s{i}"] = node("Sink", images=[str(i), 0])
    Source.calls = 0
    assert (await validate(prompt)).ok
    assert Source.calls == 1


# --- aggregation ---------------------------------------------------------------------


async def test_one_valid_output_is_enough() -> None:
    prompt = chain(**{"5": node("Source", width=0), "6": node("Sink", images=["5", 0])})
    result = await validate(prompt)
    assert result.ok and result.error is None and result.outputs == ["3"]
    assert list(result.node_errors) == ["5"]
    assert result.node_errors["5"]["dependent_outputs"] == ["6"]
    assert result.node_errors["5"]["class_type"] == "Source"


async def test_shared_bad_node_lists_every_dependent_output() -> None:
    prompt = chain(
        **{
            "1": node("Source", width=0),
            "5": node("Source", width=500),
            "6": node("Sink", images=["1", 0]),
            "7": node("Sink", images=["5", 0]),
        }
    )
    result = await validate(prompt)
    assert not result.ok and result.outputs == []
    assert {k: v["dependent_outputs"] for k, v in result.node_errors.items()} == {
        "1": ["3", "6"],
        "5": ["7"],
    }


async def test_node_errors_in_the_order_nodes_finished() -> None:
    prompt = {
        "1": node("Source", width=0),
        "2": node("Source", width=0),
        "3": node("LazyPick", first=["2", 0], second=["1", 0]),
        "4": node("Sink", images=["3", 0]),
    }
    result = await validate(prompt)
    assert list(result.node_errors) == ["2", "1"]


# --- cycles --------------------------------------------------------------------------


async def test_two_node_cycle() -> None:
    prompt = {
        "1": node("Invert", image=["2", 0]),
        "2": node("Invert", image=["1", 0]),
        "3": node("Sink", images=["2", 0]),
    }
    result = await validate(prompt)
    cycle_error = {
        "type": "dependency_cycle",
        "message": "Dependency cycle detected",
        "details": "Nodes in cycle: #1, #2",
        "extra_info": {"nodes": ["1", "2"]},
    }
    assert result.error == {
        "type": "dependency_cycle",
        "message": "Prompt contains a dependency cycle",
        "details": "Nodes in cycle: #1, #2",
        "extra_info": {"nodes": ["1", "2"]},
    }
    assert result.node_errors == {
        node_id: {"errors": [cycle_error], "dependent_outputs": ["3"], "class_type": "Invert"}
        for node_id in ("1", "2")
    }


async def test_self_loop_and_only_cycle_members_reported() -> None:
    prompt = chain(
        **{
            "1": node("LazyPick", first=["1", 0], second=["4", 0]),
            "4": node("Source", width=8),
            "6": node("Sink", images=["4", 0]),
        }
    )
    result = await validate(prompt)
    assert not result.ok and result.outputs == []
    assert result.error is not None and result.error["extra_info"] == {"nodes": ["1"]}
    assert list(result.node_errors) == ["1"]
    assert result.node_errors["1"]["dependent_outputs"] == ["3"]


async def test_cycle_not_reachable_from_outputs_is_ignored() -> None:
    prompt = chain(**{"7": node("Invert", image=["8", 0]), "8": node("Invert", image=["7", 0])})
    assert (await validate(prompt)).ok
    assert (await validate(chain(**{"7": node("Sink", images=["7", 0])}), ["3"])).ok


async def test_cycle_through_a_lazy_input_and_several_cycles() -> None:
    prompt = {
        "1": node("Source", width=8),
        "2": node("LazyPick", first=["1", 0], second=["3", 0]),
        "3": node("Invert", image=["2", 0]),
        "4": node("Sink", images=["3", 0]),
        "5": node("Invert", image=["5", 0]),
        "6": node("Sink", images=["5", 0]),
    }
    result = await validate(prompt)
    assert result.error is not None
    assert result.error["details"] == "Nodes in cycle: #2, #3, #5"
    assert list(result.node_errors) == ["2", "3", "5"]
    assert result.node_errors["2"]["errors"][0]["details"] == "Nodes in cycle: #2, #3"
    assert result.node_errors["5"]["dependent_outputs"] == ["6"]


# --- scale and robustness ------------------------------------------------------------


def long_chain(length: int) -> dict[str, Any]:
    prompt: dict[str, Any] = {"0": node("Source", width=8)}
    for i in range(1, length):
        prompt[str(i)] = node("Invert", image=[str(i - 1), 0])
    prompt["out"] = node("Sink", images=[str(length - 1), 0])
    return prompt


async def test_long_chain_is_iterative_and_fast() -> None:
    prompt = long_chain(5000)
    start = time.perf_counter()
    result = await validate(prompt)
    assert time.perf_counter() - start < 2.0
    assert result.ok and result.outputs == ["out"]
    prompt["0"]["inputs"]["width"] = 0
    result = await validate(prompt)
    assert list(result.node_errors) == ["0"]


async def test_long_cycle() -> None:
    prompt = long_chain(3000)
    prompt["0"] = node("Invert", image=["2999", 0])
    result = await validate(prompt)
    assert result.error is not None and result.error["type"] == "dependency_cycle"
    assert len(result.node_errors) == 3000
    listed = ", ".join(f"#{i}" for i in range(20))
    assert result.error["details"] == f"Nodes in cycle: {listed}, ... (3000 nodes)"
    assert len(result.error["extra_info"]["nodes"]) == 3000


JUNK = [
    {"1": {"class_type": "Sink", "inputs": {"images": {"__value__": ["1", 0]}}}},
    {"1": {"class_type": "Sink", "inputs": {"images": ["1"]}}},
    {"1": {"class_type": "Sink", "inputs": {"images": [["1"], 0]}}},
    {"1": {"class_type": "Sink", "inputs": {"images": [None, None]}}},
    {"1": {"class_type": "Widgets", "inputs": {"number": [], "text": {}, "choice": {"a": 1}}}},
    {"1": {"class_type": "Widgets", "inputs": {"number": "nan", "flag": [1, 2, 3]}}},
    {"1": {"class_type": "Widgets", "inputs": {"number": float("inf"), "text": None}}},
    {"1": {"class_type": "Widgets", "inputs": {"number": {"__value__": {"__value__": 1}}}}},
    {"1": {"class_type": "AnySink", "inputs": {"value": ["1", True]}}},
    {"1": {"class_type": "Sink", "inputs": {"images": ["2", -1]}}, "2": node("IntSource")},
]


@pytest.mark.parametrize("prompt", JUNK)
async def test_junk_never_raises(prompt: Any) -> None:
    result = await validate(prompt)
    assert isinstance(result, ValidationResult)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


def mostly(good: st.SearchStrategy[Any], junk: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `good`, so that most prompts get past the whole-prompt checks."""
    return st.sampled_from([True] * 9 + [False]).flatmap(lambda ok: good if ok else junk)


node_ids = st.sampled_from(["1", "2", "3", "4", "x"])
links = st.tuples(node_ids, st.integers(-2, 3) | st.floats() | st.booleans()).map(list)
input_values = st.one_of(
    links, json_values, st.integers(0, 30), st.fixed_dictionaries({"__value__": json_values})
)
class_types = mostly(st.sampled_from(sorted(REGISTRY.nodes)), json_values)
input_names = st.sampled_from(["image", "images", "value", "width", "mode", "number", "choice"])
inputs = mostly(st.dictionaries(input_names, input_values, max_size=5), json_values)
nodes = mostly(st.fixed_dictionaries({"class_type": class_types, "inputs": inputs}), json_values)
prompts = mostly(st.dictionaries(node_ids, nodes, max_size=5), json_values)
targets = mostly(st.none(), st.lists(node_ids, max_size=3) | json_values)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, partial=targets)
def test_fuzz_never_raises(prompt: Any, partial: Any) -> None:
    result = asyncio.run(validate_prompt(REGISTRY, prompt, partial))
    assert isinstance(result, ValidationResult)
    assert (result.error is None) == result.ok
    assert result.error is None or result.error["message"] != "Exception when validating prompt"
    assert result.ok or not result.outputs
    for entry in result.node_errors.values():
        assert entry["errors"] and entry["dependent_outputs"]
