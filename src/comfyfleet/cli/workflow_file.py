"""Reading a workflow file and applying `--set NODE.INPUT=VALUE` overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from comfyfleet.protocol.errors import error, prompt_error_body


class WorkflowError(Exception):
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


def apply_overrides(prompt: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Set `NODE.INPUT=VALUE` inputs; VALUE is parsed as JSON, else kept as a string."""
    for assignment in assignments:
        target, sep, raw = assignment.partition("=")
        node_id, dot, input_name = target.partition(".")
        if not sep or not dot or not node_id or not input_name:
            raise WorkflowError("Bad --set, expected NODE.INPUT=VALUE", assignment)
        node = prompt.get(node_id)
        if not isinstance(node, dict):
            raise WorkflowError("--set names a node that is not in the prompt", f"#{node_id}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node.setdefault("inputs", {})[input_name] = value
    return prompt
