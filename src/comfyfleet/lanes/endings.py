"""How a prompt's run on a backend ends when the backend itself does not say how:
refused by its validation, taken out of its queue, or failed on an output file name
the gateway refuses. Each is shaped as ComfyUI's own end events are."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.lanes.outputs import UnsafeOutput, output_files
from comfyfleet.lanes.uploads import ForeignFile
from comfyfleet.protocol import events
from comfyfleet.protocol.errors import error, prompt_error_body

log = logging.getLogger(__name__)


def succeeded(entry: dict[str, Any]) -> bool:
    """Whether a backend's history entry records a success."""
    status = entry.get("status") or {}
    return bool(status.get("completed") or status.get("status_str") == "success")


def foreign_file_answer(prompt: dict[str, Any], foreign: ForeignFile) -> dict[str, Any]:
    """ComfyUI's answer to a prompt naming a file it does not have (`value_not_in_list`)."""
    node = prompt.get(foreign.node_id) or {}
    problem = error(
        "value_not_in_list",
        "Value not in list",
        f"{foreign.name}: '{foreign.value}' not in list",
        input_name=foreign.name,
        received_value=foreign.value,
    )
    failed = {"errors": [problem], "dependent_outputs": [], "class_type": node.get("class_type")}
    return prompt_error_body(
        error("prompt_outputs_failed_validation", "Prompt outputs failed validation"),
        {foreign.node_id: failed},
    )


def refused_result(job: Job, answer: dict[str, Any]) -> JobResult:
    """A prompt the backend's own validation refused (a node's VALIDATE_INPUTS, say): it
    ends as an error at once, carrying ComfyUI's `error` and `node_errors`."""
    err = answer["error"]
    node_errors = answer.get("node_errors")
    node_errors = node_errors if isinstance(node_errors, dict) else {}
    lines = [f"{err.get('message', 'Prompt refused')}: {err.get('details', '')}".rstrip(": ")]
    for node_id, found in node_errors.items():
        found = found if isinstance(found, dict) else {}
        lines.append(f"{found.get('class_type')} {node_id}:")
        for item in found.get("errors") or []:
            if isinstance(item, dict):
                lines.append(f"- {item.get('message')}: {item.get('details')}")
    first_id, first = next(iter(node_errors.items()), (None, None))
    return JobResult.failed(
        events.execution_error(
            job.prompt_id,
            "\n".join(lines) + "\n",
            str(err.get("type") or "invalid_prompt"),
            node_id=first_id,
            node_type=first.get("class_type") if isinstance(first, dict) else None,
            error=err,
            node_errors=node_errors,
        )
    )


def unsafe_output_result(
    job: Job, node: Any, backend: str, exc: UnsafeOutput, outputs: dict[str, Any]
) -> JobResult:
    """The end of a prompt whose backend named an output file the gateway refuses: an
    error of the node that output it, kept with the outputs copied before it."""
    log.warning("backend %s: prompt %s: %s", backend, job.prompt_id, exc)
    node_id = node if isinstance(node, str) and node in job.prompt else None
    failed = JobResult.failed(
        events.execution_error(
            job.prompt_id,
            f"backend {backend}: {exc}",
            "comfyfleet.UnsafeOutput",
            node_id=node_id,
            node_type=job.prompt[node_id].get("class_type") if node_id else None,
            executed=list(outputs),
        )
    )
    return replace(failed, outputs=outputs, files=output_files(outputs))


def withdrawn_result(job: Job) -> JobResult:
    """A prompt taken out of the backend's queue before it started: interrupted there
    (the scheduler makes it cancelled, or puts it back in the queue, as asked)."""
    error: dict[str, Any] = {
        "prompt_id": job.prompt_id,
        "node_id": None,
        "node_type": None,
        "executed": [],
        "timestamp": events.timestamp_ms(),
    }
    return JobResult(JobStatus.INTERRUPTED, {}, {}, [["execution_interrupted", error]], error, [])
