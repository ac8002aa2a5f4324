"""POST /prompt under random and mutated prompts: a 200 with a prompt_id or ComfyUI's 400.

Never a 5xx, never a hang, and the server keeps serving (GET /prompt) afterwards.
Numbers that would validate and then allocate a huge image are kept out of the
mutations (e.g. 16384 x 16384): the point is the HTTP answer, not the machine's RAM.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.harness import (
    TIMEOUT_MARK_SECONDS,
    LiveServer,
    Reply,
    assert_comfy_error_shape,
    fuzz_settings,
)
from tests.fuzz.strategies import HUGE_NUMBERS, json_values, numbers, text

pytestmark = pytest.mark.timeout(TIMEOUT_MARK_SECONDS)


def base_prompt() -> dict[str, Any]:
    """EmptyImage(8x8) -> ImageInvert -> PreviewImage: valid and quick."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }


def check_prompt_reply(live: LiveServer, reply: Reply) -> None:
    assert reply.status in (200, 400), (reply.status, reply.body[:500])
    body = reply.json()
    if reply.status == 200:
        assert isinstance(body.get("prompt_id"), str), body
        assert isinstance(body.get("node_errors"), dict), body
        live.post_json("/queue", {"clear": True})  # accepted work must not pile up
    else:
        assert_comfy_error_shape(body)


def post_prompt(live: LiveServer, body: Any) -> None:
    check_prompt_reply(live, live.post_json("/prompt", body))


# ---------------------------------------------------------------- mutations

node_ids = st.sampled_from(["1", "2", "3"])
links = st.one_of(
    st.tuples(st.sampled_from(["1", "2", "3", "999", "", "0"]), st.integers(-2, 3)).map(list),
    st.lists(json_values, max_size=3),
    st.tuples(json_values, json_values).map(list),
)
bad_values = st.one_of(json_values, numbers, text, links)


@st.composite
def mutation(draw: st.DrawFn, prompt: dict[str, Any]) -> None:
    """Apply one random change to `prompt` in place."""
    node_id = draw(node_ids)
    node = prompt.get(node_id)
    kind = draw(
        st.sampled_from(
            [
                "input_value",
                "drop_input",
                "drop_key",
                "class_type",
                "dangling_link",
                "cycle",
                "node_value",
                "extra_input",
                "rename_node",
                "inputs_value",
            ]
        )
    )
    if not isinstance(node, dict):
        prompt[node_id] = draw(json_values)
        return
    inputs = node.get("inputs")
    if kind == "input_value" and isinstance(inputs, dict) and inputs:
        inputs[draw(st.sampled_from(sorted(inputs)))] = draw(bad_values)
    elif kind == "drop_input" and isinstance(inputs, dict) and inputs:
        del inputs[draw(st.sampled_from(sorted(inputs)))]
    elif kind == "drop_key":
        node.pop(draw(st.sampled_from(["class_type", "inputs"])), None)
    elif kind == "class_type":
        node["class_type"] = draw(st.one_of(text, json_values, st.sampled_from(["Sleep", "Fail"])))
    elif kind == "dangling_link" and isinstance(inputs, dict):
        inputs[draw(st.sampled_from(sorted(inputs) or ["image"]))] = [draw(text), 0]
    elif kind == "cycle":
        # 1 takes 3's output (or its own): a cycle through the whole prompt, or a self-loop.
        target = draw(st.sampled_from(["1", "2", "3"]))
        node.setdefault("inputs", {})
        if isinstance(node["inputs"], dict):
            node["inputs"][draw(st.sampled_from(["image", "images", "width"]))] = [target, 0]
    elif kind == "node_value":
        prompt[node_id] = draw(json_values)
    elif kind == "extra_input" and isinstance(inputs, dict):
        inputs[draw(text)] = draw(bad_values)
    elif kind == "rename_node":
        prompt[draw(text)] = prompt.pop(node_id)
    elif kind == "inputs_value":
        node["inputs"] = draw(json_values)


@st.composite
def mutated_request(draw: st.DrawFn) -> dict[str, Any]:
    prompt = base_prompt()
    for _ in range(draw(st.integers(0, 4))):  # none: a valid prompt, so hostile fields get far
        draw(mutation(prompt))
    body: dict[str, Any] = {"prompt": prompt}
    # Top-level fields: absent, sane, or hostile.
    for key in ("number", "front", "client_id", "prompt_id", "extra_data"):
        if draw(st.booleans()):
            body[key] = draw(bad_values)
    if draw(st.integers(0, 5)) == 0:
        body["partial_execution_targets"] = draw(st.one_of(json_values, st.lists(text)))
    if draw(st.integers(0, 9)) == 0:
        del body["prompt"]
    return body


@fuzz_settings(150)
@given(body=mutated_request())
def test_mutated_prompts(live: LiveServer, body: dict[str, Any]) -> None:
    post_prompt(live, body)
    live.assert_serving()


@fuzz_settings(80)
@given(body=st.one_of(json_values, st.dictionaries(st.just("prompt"), json_values)))
def test_random_json_bodies(live: LiveServer, body: Any) -> None:
    post_prompt(live, body)
    live.assert_serving()


@fuzz_settings(40)
@given(
    raw=st.one_of(st.binary(max_size=200), text.map(lambda t: t.encode("utf-8", "surrogatepass")))
)
def test_random_bytes(live: LiveServer, raw: bytes) -> None:
    reply = live.request("POST", "/prompt", data=raw, headers={"Content-Type": "application/json"})
    check_prompt_reply(live, reply)
    live.assert_serving()


# ---------------------------------------------------------------- fixed hostile shapes


def chain(length: int) -> dict[str, Any]:
    prompt: dict[str, Any] = {
        "0": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        }
    }
    for i in range(1, length):
        prompt[str(i)] = {"class_type": "ImageInvert", "inputs": {"image": [str(i - 1), 0]}}
    prompt[str(length)] = {"class_type": "PreviewImage", "inputs": {"images": [str(length - 1), 0]}}
    return prompt


def wait_idle(live: LiveServer, timeout: float = 20.0) -> None:
    """Accepted prompts also end: nothing may run (or hog a slot) for long."""
    deadline = time.monotonic() + timeout
    while live.request("GET", "/queue").json()["queue_running"]:
        assert time.monotonic() < deadline, "a prompt is still running"
        time.sleep(0.05)


def test_deep_chain(live: LiveServer) -> None:
    reply = live.post_json("/prompt", {"prompt": chain(2000)})
    assert reply.status == 200, reply.body[:500]  # 2,000 nodes deep is valid, and runs
    wait_idle(live)
    broken = chain(2000)
    broken["0"]["inputs"]["width"] = "wide"  # the error is 2,000 links from the output
    post_prompt(live, {"prompt": broken})
    looped = chain(2000)
    looped["0"] = {"class_type": "ImageInvert", "inputs": {"image": ["1999", 0]}}
    post_prompt(live, {"prompt": looped})
    live.assert_serving()


def test_cycles(live: LiveServer) -> None:
    prompt = base_prompt()
    prompt["1"] = {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}}
    post_prompt(live, {"prompt": prompt})
    prompt["2"]["inputs"]["image"] = ["2", 0]
    post_prompt(live, {"prompt": prompt})
    live.assert_serving()


def test_huge_numbers(live: LiveServer) -> None:
    for value in HUGE_NUMBERS:
        for key in ("width", "batch_size", "color"):
            prompt = base_prompt()
            prompt["1"]["inputs"][key] = value
            post_prompt(live, {"prompt": prompt})
        post_prompt(live, {"prompt": base_prompt(), "number": value})
        post_prompt(live, {"prompt": base_prompt(), "prompt_id": value})
    # Numbers Python's json reads but floats cannot hold, and non-standard JSON constants.
    encoded = json.dumps(base_prompt())
    raws = [
        f'{{"prompt": {encoded}, "number": 1e999}}',
        f'{{"prompt": {encoded}, "number": -Infinity}}',
        f'{{"prompt": {encoded}, "number": NaN}}',
        f'{{"prompt": {encoded}, "number": "nan"}}',
        f'{{"prompt": {encoded}, "number": {"9" * 5000}}}',  # past Python's int digit limit
        "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser's recursion
        f'{{"prompt": {{"1": {{"class_type": "EmptyImage", "inputs": {{"width": {"[" * 900}'
        f"{']' * 900}}}}}}}}}",
    ]
    for raw in raws:
        reply = live.request(
            "POST", "/prompt", data=raw, headers={"Content-Type": "application/json"}
        )
        check_prompt_reply(live, reply)
    for path in ("/queue", "/history", "/api/jobs"):  # what was queued still reads back
        assert live.request("GET", path).status == 200
    live.assert_serving()


def test_unicode(live: LiveServer) -> None:
    prompt = base_prompt()
    prompt["\u202e\U0001f600"] = prompt.pop("3")
    post_prompt(live, {"prompt": prompt, "client_id": "\u0000\ud7ff", "prompt_id": "\u00e9" * 200})
    live.assert_serving()


def test_ten_megabyte_string(live: LiveServer) -> None:
    """Once, not per example: in a string input, as a class_type, as a node id and a key."""
    big = "\u00e9" + "x" * (10 * 1024 * 1024)
    prompt = base_prompt()
    prompt["3"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["2", 0], "filename_prefix": big},
    }
    post_prompt(live, {"prompt": prompt})
    post_prompt(live, {"prompt": {"1": {"class_type": big, "inputs": {}}}})
    post_prompt(live, {"prompt": {big: base_prompt()["1"]}})
    post_prompt(live, {"prompt": base_prompt(), "prompt_id": big, "client_id": big})
    post_prompt(live, {"prompt": base_prompt(), "extra_data": {big: big}})
    wait_idle(live)
    live.assert_serving()


def test_mutations_of_copies_do_not_leak(live: LiveServer) -> None:
    """The base prompt itself is accepted, so a 400 above is the mutation's doing."""
    reply = live.post_json("/prompt", copy.deepcopy(base_prompt()))
    assert reply.status == 400  # no "prompt" key
    reply = live.post_json("/prompt", {"prompt": base_prompt()})
    assert reply.status == 200, reply.body
