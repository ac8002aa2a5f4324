"""Payload builders for ComfyUI's WebSocket events, shaped as ComfyUI 0.3.64 sends them."""

from __future__ import annotations

import time
from typing import Any

#: The events that end a prompt's run: exactly one of them closes each prompt's stream.
END_EVENTS = frozenset({"execution_success", "execution_error", "execution_interrupted"})


def timestamp_ms() -> int:
    return int(time.time() * 1000)


def execution_start(prompt_id: str) -> dict[str, Any]:
    return {"prompt_id": prompt_id, "timestamp": timestamp_ms()}


def execution_error(
    prompt_id: str,
    message: str,
    exception_type: str,
    *,
    node_id: str | None = None,
    node_type: str | None = None,
    executed: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """`execution_error` for an error raised outside any node's code (no traceback)."""
    return {
        "prompt_id": prompt_id,
        "node_id": node_id,
        "node_type": node_type,
        "executed": executed or [],
        "exception_message": message,
        "exception_type": exception_type,
        "traceback": [],
        "current_inputs": {},
        "current_outputs": [],
        **extra,
        "timestamp": timestamp_ms(),
    }


def executing(
    prompt_id: str, node_id: str | None, display_node: str | None = None
) -> dict[str, Any]:
    """`executing`; `node: None` is the done signal of a prompt."""
    if node_id is None:
        return {"node": None, "prompt_id": prompt_id}
    return {"node": node_id, "display_node": display_node or node_id, "prompt_id": prompt_id}


def executed(
    prompt_id: str, node_id: str, output: Any, display_node: str | None = None
) -> dict[str, Any]:
    return {
        "node": node_id,
        "display_node": display_node or node_id,
        "output": output,
        "prompt_id": prompt_id,
    }


def progress(prompt_id: str, node_id: str, value: float, total: float) -> dict[str, Any]:
    return {"value": value, "max": total, "prompt_id": prompt_id, "node": node_id}


def node_meta(
    node_id: str,
    display_node: str | None = None,
    parent_node: str | None = None,
    real_node_id: str | None = None,
) -> dict[str, Any]:
    """The `meta` entry of a history record for one output node (an expanded node has
    a parent, and the submitted node it descends from is its real node)."""
    return {
        "node_id": node_id,
        "display_node": display_node or node_id,
        "parent_node": parent_node,
        "real_node_id": real_node_id or node_id,
    }


def status(queue_remaining: int, sid: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": queue_remaining}}}
    if sid is not None:
        data["sid"] = sid
    return data
