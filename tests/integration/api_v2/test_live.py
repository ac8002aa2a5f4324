"""A v2 job's live fields against a real gateway: `queue_position` while it waits (in
GET /api/v2/jobs/{id}, the SDK's Job model and the SSE status events) and `progress`
while it runs (the snapshot the stream pushes); both null once the job is over."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from comfy_low import AsyncComfyLow
from comfy_sdk import StatusChange, Workflow

from comfyfleet.shares.policy import SharePolicy
from tests.integration.api_v2.conftest import (
    ALICE,
    BOB,
    TOKENS,
    Served,
    image_workflow,
    serve,
    slow_workflow,
)
from tests.integration.api_v2.test_sdk import until_status


def stepping_workflow(steps: int = 200, seconds_per_step: float = 0.05) -> dict[str, Any]:
    """An image passed through a node that reports `steps` steps of progress."""
    flow = image_workflow("steps")
    flow["3"] = {
        "class_type": "Progress",
        "inputs": {"value": ["1", 0], "steps": steps, "seconds_per_step": seconds_per_step},
    }
    flow["2"]["inputs"]["images"] = ["3", 0]
    return flow


async def job_of(served: Served, job_id: str, token: str | None = None) -> dict[str, Any]:
    status, _, body = await served.call("GET", f"/api/v2/jobs/{job_id}", token=token)
    assert status == 200
    assert isinstance(body, dict)
    return body


async def test_a_waiting_job_shows_its_place_and_a_running_one_its_progress(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served.client(monkeypatch) as comfy, AsyncComfyLow(served.url) as low:
        running = await comfy.submit(Workflow(stepping_workflow()))
        await until_status(running, "running")
        first = await comfy.submit(Workflow(image_workflow("first")))  # one slot: they wait
        second = await comfy.submit(Workflow(image_workflow("second")))
        # The SDK's own model of the job (the generated pydantic Job) reads the place.
        model = await low.get_job(second.id)
        assert (model.status.value, model.queue_position, model.progress) == ("queued", 2, None)
        assert (await job_of(served, first.id))["queue_position"] == 1
        # The running job: no place, and the snapshot the stream pushes, from its log.
        async with asyncio.timeout(20):
            while True:
                body = await job_of(served, running.id)
                progress = body["progress"]
                if progress is not None and progress["step"]:
                    break
                await asyncio.sleep(0.05)
        assert body["queue_position"] is None
        assert progress["nodes_total"] == 3 and progress["steps"] == 200
        assert (progress["current_node"], progress["current_node_class"]) == ("3", "Progress")
        assert progress["message"] == f"Progress {progress['step']}/200"
        assert 0.0 < progress["value"] < 1.0 and progress["nodes_done"] == 1  # node 1 is done
        running_model = await low.get_job(running.id)
        assert running_model.progress is not None and running_model.progress.steps == 200
        # The stream of the second job: its place now, then its moves up the queue.
        stream = second.events()
        opening = await anext(stream)
        assert isinstance(opening, StatusChange)
        assert (opening.status, opening.queue_position) == ("queued", 2)
        await first.cancel()
        async with asyncio.timeout(10):
            moved = await anext(stream)
        assert isinstance(moved, StatusChange)
        assert (moved.status, moved.queue_position) == ("queued", 1)
        await running.cancel()
        async with asyncio.timeout(30):
            rest = [e async for e in stream if isinstance(e, StatusChange)]
        assert [(e.status, e.queue_position) for e in rest] == [
            ("running", None),
            ("succeeded", None),
        ]
        await running.wait(timeout=20)
        # Over: neither field says anything any more.
        for job_id in (running.id, first.id, second.id):
            body = await job_of(served, job_id)
            assert body["status"] in ("canceled", "succeeded")
            assert (body["queue_position"], body["progress"]) == (None, None)


async def test_with_fair_share_a_place_counts_the_tenants_own_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants' jobs interleave by shares, so only a tenant's own waiting jobs surely go
    first; with fair share off there is one order, and every waiting job counts."""
    for enabled in (True, False):
        async for served in serve(
            tmp_path / str(enabled),
            local_slots=1,
            auth_tokens=TOKENS,
            shares=SharePolicy(enabled=enabled),
        ):
            async with served.client(monkeypatch, ALICE) as alice:
                busy = await alice.submit(Workflow(slow_workflow(60)))
                await until_status(busy, "running")
                a1 = await alice.submit(Workflow(image_workflow("a1")))
                async with served.client(monkeypatch, BOB) as bob:
                    b1 = await bob.submit(Workflow(image_workflow("b1")))
                a2 = await alice.submit(Workflow(image_workflow("a2")))
                places = {
                    name: (await job_of(served, job.id, token))["queue_position"]
                    for name, job, token in (("a1", a1, ALICE), ("b1", b1, BOB), ("a2", a2, ALICE))
                }
                if enabled:
                    assert places == {"a1": 1, "b1": 1, "a2": 2}
                else:
                    assert places == {"a1": 1, "b1": 2, "a2": 3}
                await busy.cancel()


async def test_a_running_job_has_no_progress_when_the_event_log_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for served in serve(tmp_path, local_slots=1, events_retention=0):
        async with served.client(monkeypatch) as comfy:
            running = await comfy.submit(Workflow(stepping_workflow()))
            await until_status(running, "running")
            waiting = await comfy.submit(Workflow(image_workflow("later")))
            await asyncio.sleep(0.3)  # steps run meanwhile; none is logged
            body = await job_of(served, running.id)
            assert (body["status"], body["progress"]) == ("running", None)
            assert (await job_of(served, waiting.id))["queue_position"] == 1
            await running.cancel()
