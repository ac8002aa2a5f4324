"""Compact JSON text for frames and the event log: orjson's output where it can, the
standard library's for what orjson refuses, and never a `NaN` a browser cannot parse."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from comfyfleet.protocol import json_text

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text() | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


def finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


@given(values)
def test_any_value_encodes_as_json_every_parser_reads_back(value: Any) -> None:
    text = json_text.dumps(value)
    parsed = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    expected = finite(value)
    if isinstance(value, dict) and any(not isinstance(k, str) for k in value):
        expected = json.loads(json.dumps(expected))  # keys as the standard library writes them
    assert parsed == json.loads(json.dumps(expected))


def test_what_orjson_refuses_is_encoded_all_the_same() -> None:
    assert (
        json_text.dumps({"n": 2**70, "x": float("nan")}) == '{"n":1180591620717411303424,"x":null}'
    )
    assert json_text.dumps({1: "a"}) == '{"1":"a"}'
    assert json.loads(json_text.dumps({"s": "\ud800"})) == {"s": "\ud800"}
    assert json_text.dumps({"a": [1.5, None, True], "b": "é"}) == '{"a":[1.5,null,true],"b":"é"}'
