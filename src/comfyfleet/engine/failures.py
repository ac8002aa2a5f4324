"""How a run ends early, and how it tells so: the node that failed or was interrupted,
in the fields of ComfyUI's `execution_error` and `execution_interrupted` events."""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Any

from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.graph import DependencyCycleError
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.errors import full_type_name


class NodeFailure(ComfyfleetError):
    """A node failed; carries the ComfyUI `execution_error` fields."""

    def __init__(self, node_id: str, exc: BaseException, inputs: dict[str, list[Any]]) -> None:
        super().__init__(str(exc))
        self.node_id = node_id
        self.exc = exc
        self.inputs = inputs


class Interrupted(ComfyfleetError):
    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


class FailureReport:
    """Tells where a run stopped, in ComfyUI's terms: a node an expansion added is
    reported on the submitted node it descends from."""

    def __init__(self, prompt_id: str, prompt: dict[str, Any], dynprompt: DynamicPrompt) -> None:
        self.prompt_id = prompt_id
        self.prompt = prompt  # as submitted
        self.dynprompt = dynprompt

    def interrupted(self, node_id: str, executed: list[str]) -> dict[str, Any]:
        """ComfyUI's `execution_interrupted` (also the head of `execution_error`)."""
        real = self.dynprompt.get_real_node_id(node_id)
        node_type = self.prompt[real]["class_type"] if real in self.prompt else None
        return {
            "prompt_id": self.prompt_id,
            "node_id": real,
            "node_type": node_type,
            "executed": list(executed),
        }

    def error(
        self, fail: NodeFailure, executed: list[str], produced: Iterable[str]
    ) -> dict[str, Any]:
        """ComfyUI's `execution_error`; `produced`: the nodes that have outputs."""
        exc = fail.exc
        inputs = {k: [_format_value(v) for v in vs] for k, vs in fail.inputs.items()}
        payload = {
            **self.interrupted(fail.node_id, executed),
            "exception_message": f"{exc}\n",
            "exception_type": full_type_name(type(exc)),
            "traceback": traceback.format_tb(exc.__traceback__),
            "current_inputs": inputs,
            "current_outputs": list(produced),
        }
        if isinstance(exc, DependencyCycleError):  # ComfyUI's own name and shape for it
            payload.update(exception_type="graph.DependencyCycleError", traceback=[])
            payload.update(exception_message=str(exc), current_inputs=[])
        return payload

    def blocked(
        self, node_id: str, node_type: str, message: str, executed: list[str]
    ) -> dict[str, Any]:
        """The `execution_error` a blocker with a message reports (ComfyUI's shape)."""
        return {
            "prompt_id": self.prompt_id,
            "node_id": node_id,
            "node_type": node_type,
            "executed": list(executed),
            "exception_message": f"Execution Blocked: {message}",
            "exception_type": "ExecutionBlocked",
            "traceback": [],
            "current_inputs": [],
            "current_outputs": [],
        }


def _format_value(value: Any) -> Any:
    if value is None or isinstance(value, int | float | bool | str):
        return value
    return str(value)
