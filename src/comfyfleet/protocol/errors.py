"""ComfyUI's error objects: `{type, message, details, extra_info}`."""

from __future__ import annotations

from typing import Any


def error(type_: str, message: str, details: str = "", **extra_info: Any) -> dict[str, Any]:
    return {"type": type_, "message": message, "details": details, "extra_info": extra_info}


def prompt_error_body(
    err: dict[str, Any], node_errors: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The 400 body of POST /prompt: `{error, node_errors}`."""
    return {"error": err, "node_errors": node_errors or {}}


def full_type_name(klass: type) -> str:
    """`RuntimeError` for builtins, `module.Qualname` otherwise, as ComfyUI reports it."""
    module = klass.__module__
    if module == "builtins":
        return klass.__qualname__
    return f"{module}.{klass.__qualname__}"
