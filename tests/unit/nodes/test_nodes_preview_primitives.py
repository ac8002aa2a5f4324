"""PreviewAny text rendering and the primitive pass-through nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from comfyfleet.nodes.core.preview import PreviewAny
from comfyfleet.nodes.core.primitives import (
    PrimitiveBoolean,
    PrimitiveFloat,
    PrimitiveInt,
    PrimitiveString,
    PrimitiveStringMultiline,
)


@pytest.mark.parametrize(
    ("source", "text"),
    [
        (64, "64"),
        (1.5, "1.5"),
        (True, "True"),
        ("a\nb", "a\nb"),
        (None, "None"),
        ([1, "a", None], '[1, "a", null]'),
        ({"k": [1.0]}, '{"k": [1.0]}'),
    ],
)
def test_preview_any_text(source: Any, text: str) -> None:
    assert PreviewAny().main(source) == {"ui": {"text": [text]}}


def test_preview_any_falls_back_to_str_for_non_json_values() -> None:
    value = np.array([1, 2])
    assert PreviewAny().main(value) == {"ui": {"text": [str(value)]}}


@pytest.mark.parametrize(
    ("node", "value"),
    [
        (PrimitiveInt, -(2**62)),
        (PrimitiveFloat, 2.5),
        (PrimitiveString, "text"),
        (PrimitiveStringMultiline, "two\nlines"),
        (PrimitiveBoolean, False),
    ],
)
def test_primitives_pass_value_through(node: type[Any], value: Any) -> None:
    instance = node()
    assert getattr(instance, node.FUNCTION)(value=value) == (value,)
