"""Constant-value nodes (ComfyUI's `utils/primitive` category)."""

from __future__ import annotations

import sys
from typing import Any


class _Primitive:
    """Passes its single `value` widget through unchanged."""

    FUNCTION = "execute"
    CATEGORY = "utils/primitive"
    # ComfyUI reports these for nodes written against its newer schema API, as these are.
    OUTPUT_TOOLTIPS = (None,)
    DEPRECATED = False
    EXPERIMENTAL = False
    API_NODE = False
    VALUE_INPUT: tuple[Any, ...] = ()

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        kind, options = cls.VALUE_INPUT
        return {"required": {"value": (kind, dict(options))}}

    def execute(self, value: Any) -> tuple[Any]:
        return (value,)


class PrimitiveInt(_Primitive):
    RETURN_TYPES = ("INT",)
    VALUE_INPUT = (
        "INT",
        {"min": -sys.maxsize, "max": sys.maxsize, "control_after_generate": True},
    )


class PrimitiveFloat(_Primitive):
    RETURN_TYPES = ("FLOAT",)
    VALUE_INPUT = ("FLOAT", {"min": -sys.maxsize, "max": sys.maxsize})


class PrimitiveString(_Primitive):
    RETURN_TYPES = ("STRING",)
    VALUE_INPUT = ("STRING", {"multiline": False})


class PrimitiveStringMultiline(_Primitive):
    RETURN_TYPES = ("STRING",)
    VALUE_INPUT = ("STRING", {"multiline": True})


class PrimitiveBoolean(_Primitive):
    RETURN_TYPES = ("BOOLEAN",)
    VALUE_INPUT = ("BOOLEAN", {})


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "PrimitiveString": PrimitiveString,
    "PrimitiveStringMultiline": PrimitiveStringMultiline,
    "PrimitiveInt": PrimitiveInt,
    "PrimitiveFloat": PrimitiveFloat,
    "PrimitiveBoolean": PrimitiveBoolean,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "PrimitiveString": "String",
    "PrimitiveStringMultiline": "String (Multiline)",
    "PrimitiveInt": "Int",
    "PrimitiveFloat": "Float",
    "PrimitiveBoolean": "Boolean",
}

PYTHON_MODULES = dict.fromkeys(NODE_CLASS_MAPPINGS, "comfy_extras.nodes_primitive")
