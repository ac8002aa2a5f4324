"""What `GET /api/fleet/demand` says the queue needs: pending prompts grouped by the
node classes the gateway's own engine lacks, most wanted first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from comfyfleet.domain.jobs import Job
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.server.workers.demand import _grouped


def pending(*classes: str) -> Job:
    prompt: dict[str, Any] = {
        str(n): {"class_type": c, "inputs": {}} for n, c in enumerate(classes, start=1)
    }
    return cast(Job, SimpleNamespace(prompt=prompt))


def test_prompts_are_grouped_by_the_classes_the_engine_lacks(registry: NodeRegistry) -> None:
    jobs = [
        pending("EmptyImage", "UpscaleWithModelX", "SaveImage"),
        pending("LoadVideoY", "UpscaleWithModelX"),
        pending("UpscaleWithModelX", "EmptyImage"),
        pending("EmptyImage", "SaveImage"),  # the engine runs it: needs nothing
        pending("LoadVideoY", "UpscaleWithModelX", "PreviewImage"),
    ]
    assert _grouped(jobs, registry) == [
        {"classes": ["UpscaleWithModelX"], "pending": 2},
        {"classes": ["LoadVideoY", "UpscaleWithModelX"], "pending": 2},
        {"classes": [], "pending": 1},
    ]
