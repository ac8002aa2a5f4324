"""Reading a workflow file and applying `--set NODE.INPUT=VALUE` overrides."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.errors import error, prompt_error_body


class WorkflowError(ComfyfleetError):
    """A workflow file that cannot be used, reported in ComfyUI's error shape."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return prompt_error_body(error("invalid_prompt", self.message, self.details))


def load_prompt(path: Path) -> dict[str, Any]:
    """An API-format prompt from a file (bare, or wrapped as `{"prompt": ...}`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkflowError("Workflow file not found", str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkflowError("Workflow file is not valid JSON", f"{path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("prompt"), dict):
        data = data["prompt"]
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise WorkflowError(
            "This is a UI workflow, not an API-format prompt",
            "export it from ComfyUI with 'Export (API)'",
        )
    if not isinstance(data, dict):
        raise WorkflowError("A prompt must be a JSON object of nodes", str(path))
    return data


def apply_overrides(
    prompt: dict[str, Any],
    assignments: list[str],
    display_names: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Set `NODE.INPUT=VALUE` inputs; VALUE is parsed as JSON, else kept as a string.

    NODE is a node id; else a node title (`_meta.title`, as the editor exports it);
    else a class or its display name. A title or class sets the input of every node
    that has it.
    """
    for assignment in assignments:
        target, sep, raw = assignment.partition("=")
        name, dot, input_name = target.rpartition(".")
        if not sep or not dot or not name or not input_name:
            raise WorkflowError("Bad --set, expected NODE.INPUT=VALUE", assignment)
        nodes = _addressed(prompt, name, display_names or {})
        if not nodes:
            raise WorkflowError(
                "--set names no node: no node id, title or class is called that", repr(name)
            )
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        for node in nodes:
            node.setdefault("inputs", {})[input_name] = value
    return prompt


def _addressed(
    prompt: dict[str, Any], name: str, display_names: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """The nodes `name` addresses: by id, else by title, else by class or display name."""
    nodes = [node for node in prompt.values() if isinstance(node, dict)]
    by_id = prompt.get(name)
    if isinstance(by_id, dict):
        return [by_id]
    titled = [node for node in nodes if _title(node) == name]
    if titled:
        return titled
    return [
        node
        for node in nodes
        if node.get("class_type") == name or display_names.get(str(node.get("class_type"))) == name
    ]


def _title(node: dict[str, Any]) -> Any:
    meta = node.get("_meta")
    return meta.get("title") if isinstance(meta, dict) else None
