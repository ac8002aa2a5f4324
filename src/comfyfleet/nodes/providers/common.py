"""What every provider node shares: reaching the fan-out service, and running one job now."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.engine.context import current_node
from comfyfleet.engine.services import optional_service, service
from comfyfleet.fanout.request import RemoteRequest
from comfyfleet.fanout.service import SERVICE, FanoutService
from comfyfleet.fanout.task import TaskState

API_CONFIG = "API_CONFIG"
MAX_SEED = 0xFFFFFFFF


def fanout() -> FanoutService:
    return service(SERVICE)


def failure_epoch() -> int:
    """An IS_CHANGED value: changes whenever a job fails, so failures are never cached."""
    found = optional_service(SERVICE)
    return 0 if found is None else found.failure_epoch


def seed_input() -> tuple[str, dict[str, Any]]:
    return (
        "INT",
        {
            "default": 0,
            "min": 0,
            "max": MAX_SEED,
            "control_after_generate": True,
            "tooltip": "A new seed is a new job; the same seed with the same inputs reuses "
            "the earlier result instead of paying again.",
        },
    )


def skip_error_input(stand_in: str = "a white 512x512 image") -> tuple[str, dict[str, Any]]:
    return (
        "BOOLEAN",
        {
            "default": False,
            "tooltip": f"On failure, output {stand_in} instead of failing the prompt "
            "(reported as skipped_error, never as success).",
        },
    )


def png_base64(image: Any) -> str:
    """The first frame of an IMAGE as base64 PNG, the way JSON APIs take input images."""
    return base64.b64encode(imaging.frame_png(image)).decode("ascii")


async def build_request(
    build: Callable[..., RemoteRequest], inputs: dict[str, Any]
) -> RemoteRequest:
    """Build a request, off the event loop when there are images to encode (CPU work).

    Plain values are built at once: the hop to a worker thread and back costs far
    more than building a JSON body, and a wide batch pays it once per job.
    """
    if any(_holds_array(value) for value in inputs.values()):
        return await asyncio.to_thread(lambda: build(**inputs))
    return build(**inputs)


def _holds_array(value: Any) -> bool:
    """An image, or a list of them (a list input)."""
    if isinstance(value, list | tuple):
        return any(isinstance(item, np.ndarray) for item in value)
    return isinstance(value, np.ndarray)


async def run_now(request: RemoteRequest) -> Any:
    """Run one job through the pool and journal, and wait for it: the serial node's path."""
    node = current_node()
    jobs = fanout()
    task = await jobs.submit(request, node)
    try:
        await asyncio.wait([task.finished])  # not `await`: that would cancel the shared future
    except asyncio.CancelledError:
        await jobs.abandon([task], node)
        raise
    if task.state == TaskState.SKIPPED_ERROR and node is not None:
        node.send_text(f"skipped after an error: {task.info.error}")
    if task.state in (TaskState.SUCCESS, TaskState.SKIPPED_ERROR):
        return task.value
    if task.error is not None:
        raise task.error
    raise RuntimeError(f"the {request.provider} job was cancelled")
