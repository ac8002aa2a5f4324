"""v2's progress snapshot (comfy_api_v2/live.py) from a job's ComfyUI events."""

from __future__ import annotations

from typing import Any

from comfyfleet.domain.jobs import NewJob
from comfyfleet.server.comfy_api_v2.live import Progress

GRAPH = {
    "1": {"class_type": "EmptyImage", "inputs": {}},
    "2": {"class_type": "KSampler", "inputs": {}},
    "3": {"class_type": "SaveImage", "inputs": {}},
}


def test_a_new_attempt_starts_the_snapshot_over() -> None:
    """A job given back to the queue (its lane lost) runs its graph again: what the
    first attempt finished is not done in the second."""
    progress = Progress(NewJob("p", 1, False, GRAPH, {}, ["3"]).pending(1, 0.0))
    events: list[tuple[str, dict[str, Any]]] = [
        ("execution_start", {}),
        ("executing", {"node": "1"}),
        ("executing", {"node": "2"}),
        ("progress", {"value": 5, "max": 20}),
    ]
    for kind, data in events:
        progress.apply(kind, data)
    first = progress.snapshot()
    assert (first["nodes_done"], first["message"]) == (1, "KSampler 5/20")
    progress.apply("execution_start", {})
    progress.apply("executing", {"node": "1"})
    again = progress.snapshot()
    assert again["nodes_done"] == 0 and again["current_node"] == "1"
    assert (again["step"], again["steps"], again["message"]) == (None, None, None)
    assert again["value"] == 0.0
