"""comfy-sdk (Comfy's own client for Comfy API v2) against a real gateway: run and read
outputs, events, cancel, single-use idempotency keys, the job list, tenants, and the
v2 face and the ComfyUI face showing one queue."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from comfy_sdk import (
    AsyncJob,
    AsyncOutput,
    IdempotencyKeyReuse,
    NotFound,
    OutputReady,
    Preview,
    Progress,
    StatusChange,
    Workflow,
)
from comfy_sdk.exceptions import ComfyError

from tests.integration.api_v2.conftest import (
    ALICE,
    BOB,
    Served,
    image_workflow,
    serve,
    slow_workflow,
)

PNG = b"\x89PNG\r\n\x1a\n"


async def until_status(job: AsyncJob, wanted: str, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while (await job.refresh()).status != wanted:
            await asyncio.sleep(0.05)


async def test_run_reads_outputs_and_the_job_shows_in_the_comfyui_face(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served.client(monkeypatch) as comfy:
        job = await comfy.run(Workflow(image_workflow("sdk")), timeout=30)
        assert job.status == "succeeded"
        [output] = job.outputs
        assert (output.node_id, output.type, output.content_type) == ("2", "image", "image/png")
        assert output.name.startswith("sdk") and output.job_id == job.id
        data = await output.to_bytes()
        assert data.startswith(PNG) and len(data) == output.size_bytes
        assert await output.to_bytes(range=(0, 3)) == data[:4]  # a Range request: 206
        graph = (await job.get_workflow()).graph
        assert {k: v["class_type"] for k, v in graph.items()} == {
            "1": "EmptyImage",
            "2": "SaveImage",
        }
        again = await comfy.jobs.get(job.id)
        assert again.status == "succeeded" and [o.id for o in again.outputs] == [output.id]
    # The same job through /api/jobs and /history, with the same file.
    status, _, listed = await served.call("GET", f"/api/jobs/{job.id}")
    assert status == 200 and listed["status"] == "completed"
    _, _, history = await served.call("GET", f"/history/{job.id}")
    [saved] = history[job.id]["outputs"]["2"]["images"]
    assert saved["filename"] == output.name
    async with served.session.get(
        served.url + "/view", params={"filename": saved["filename"], "type": "output"}
    ) as view:
        assert await view.read() == data


async def test_a_prompt_queued_through_post_prompt_shows_through_v2(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, _, answer = await served.call("POST", "/prompt", json={"prompt": image_workflow("v1")})
    assert status == 200
    async with served.client(monkeypatch) as comfy:
        job = await comfy.jobs.get(answer["prompt_id"])
        await job.wait(timeout=30)
        assert job.status == "succeeded"
        [output] = job.outputs
        assert (await output.to_bytes()).startswith(PNG)
        ids = [summary.id async for summary in comfy.list_jobs()]
        assert ids == [answer["prompt_id"]]


async def test_events_bring_status_progress_previews_and_outputs_before_the_end(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = image_workflow("events")
    flow["3"] = {
        "class_type": "Progress",
        "inputs": {"value": ["1", 0], "steps": 6, "seconds_per_step": 0.15, "previews": True},
    }
    flow["2"]["inputs"]["images"] = ["3", 0]
    async with served.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(flow))
        seen: list[Any] = []
        async with asyncio.timeout(30):
            async for event in job.events():
                seen.append(event)
        assert isinstance(seen[0], StatusChange) and seen[0].status in ("queued", "running")
        assert isinstance(seen[-1], StatusChange) and seen[-1].status == "succeeded"
        progress = [e for e in seen if isinstance(e, Progress)]
        assert progress and all(0.0 <= p.value <= 1.0 for p in progress)
        assert any(p.current_node == "3" and p.steps == 6 for p in progress)
        previews = [e for e in seen if isinstance(e, Preview)]
        assert previews and previews[0].node_id == "3"
        assert previews[0].data.startswith(b"\xff\xd8")  # a JPEG
        [ready] = [e for e in seen if isinstance(e, OutputReady)]
        assert isinstance(ready.output, AsyncOutput)
        assert (await ready.output.to_bytes()).startswith(PNG)
        await job.refresh()
        assert [o.id for o in job.outputs] == [ready.output.id]
        # A stream opened after the end: the outputs, then the terminal status.
        late = [event async for event in job.events()]
        assert [type(e) for e in late] == [OutputReady, StatusChange]


async def test_cancel_takes_a_queued_job_out_and_stops_a_running_one(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served.client(monkeypatch) as comfy:
        running = await comfy.submit(Workflow(slow_workflow(60)))
        await until_status(running, "running")
        queued = await comfy.submit(Workflow(image_workflow("never")))  # one slot: it waits
        assert (await queued.refresh()).status == "queued"
        assert (await queued.cancel()).status == "canceled"
        await running.cancel()
        assert running.status in ("canceling", "canceled")
        await running.wait(timeout=20)
        assert running.status == "canceled" and running.outputs == []
        assert (await running.cancel()).status == "canceled"  # idempotent
        assert (await queued.refresh()).status == "canceled"
    _, _, never = await served.call("GET", f"/api/jobs/{queued.id}")
    assert never["status"] == "cancelled" and never["execution_start_time"] is None
    _, _, stopped = await served.call("GET", f"/api/jobs/{running.id}")
    assert stopped["status"] in ("cancelled", "interrupted")
    _, _, queue = await served.call("GET", "/queue")
    assert queue == {"queue_running": [], "queue_pending": []}


async def test_an_idempotency_key_is_single_use_and_names_the_first_job(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = str(uuid.uuid4())
    async with served.client(monkeypatch) as comfy:
        first = await comfy.submit(Workflow(image_workflow("once")), idempotency_key=key)
        await first.wait(timeout=30)
        for flow in (image_workflow("once"), image_workflow("other")):
            with pytest.raises(IdempotencyKeyReuse) as reused:
                await comfy.submit(Workflow(flow), idempotency_key=key)
            assert reused.value.details == {"job_id": first.id}
        assert [s.id async for s in comfy.list_jobs()] == [first.id]  # nothing else queued
        # A POST /prompt key of the same text is another namespace: it queues.
        status, _, _ = await served.call(
            "POST", "/prompt", json={"prompt": image_workflow()}, headers={"Idempotency-Key": key}
        )
        assert status == 200


async def test_the_list_pages_newest_first_and_filters_by_labels(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served.client(monkeypatch) as comfy:
        jobs = []
        for n in range(5):
            labels = {"batch": "a" if n % 2 else "b", "n": str(n)}
            jobs.append(await comfy.submit(Workflow(image_workflow(f"l{n}")), metadata=labels))
        for job in jobs:
            await job.wait(timeout=30)
        assert jobs[1].metadata == {"batch": "a", "n": "1"}
        listed = [s async for s in comfy.list_jobs(limit=2)]  # three pages
        assert [s.id for s in listed] == [j.id for j in reversed(jobs)]
        assert {s.status for s in listed} == {"succeeded"} and listed[0].create_time is not None
        only_a = [s.id async for s in comfy.list_jobs(metadata={"batch": "a"}, limit=2)]
        assert only_a == [jobs[3].id, jobs[1].id]
    _, _, page = await served.call("GET", "/api/v2/jobs?limit=2&status=succeeded")
    assert len(page["jobs"]) == 2 and page["next_cursor"]
    _, _, rest = await served.call("GET", f"/api/v2/jobs?limit=10&cursor={page['next_cursor']}")
    assert [j["id"] for j in page["jobs"] + rest["jobs"]] == [j.id for j in reversed(jobs)]
    assert "next_cursor" not in rest


async def test_tenants_see_only_their_own_jobs_and_keys(
    tenants: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "shared-key"
    async with tenants.client(monkeypatch, ALICE) as alice:
        mine = await alice.run(Workflow(image_workflow("alice")), timeout=30)
        [output] = mine.outputs
    async with tenants.client(monkeypatch, BOB) as bob:
        with pytest.raises(NotFound):
            await bob.jobs.get(mine.id)
        assert [s.id async for s in bob.list_jobs()] == []
        status, _, body = await tenants.call(
            "GET", f"/api/v2/assets/{output.id}/content", token=BOB
        )
        assert status == 404 and body["error"]["code"] == "not_found"
        status, _, _ = await tenants.call("POST", f"/api/v2/jobs/{mine.id}/cancel", token=BOB)
        assert status == 404
        theirs = await bob.submit(Workflow(image_workflow("bob")), idempotency_key=key)
    async with tenants.client(monkeypatch, ALICE) as alice:
        again = await alice.submit(Workflow(image_workflow("alice")), idempotency_key=key)
        assert again.id != theirs.id  # keys are per tenant
    async with tenants.client(monkeypatch) as nobody:
        with pytest.raises(ComfyError) as refused:
            await nobody.jobs.get(mine.id)
        assert refused.value.code == "unauthorized"


async def test_events_end_with_the_outcome_when_the_event_log_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for served in serve(tmp_path, local_slots=1, events_retention=0):
        async with served.client(monkeypatch) as comfy:
            running = await comfy.submit(Workflow(slow_workflow(60)))
            waiting = await comfy.submit(Workflow(image_workflow("later")))
            await until_status(running, "running")
            stream = waiting.events()
            first = await anext(stream)
            assert isinstance(first, StatusChange) and first.status == "queued"
            await waiting.cancel()  # cancelled while queued: no event is ever logged for it
            async with asyncio.timeout(10):
                rest = [event async for event in stream]
            assert [(type(e), getattr(e, "status", None)) for e in rest] == [
                (StatusChange, "canceled")
            ]
            await running.cancel()
            async with asyncio.timeout(20):
                ends = [e async for e in running.events()]
            assert isinstance(ends[-1], StatusChange) and ends[-1].status == "canceled"


async def test_a_cancelled_running_job_is_canceling_until_it_has_stopped(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = image_workflow("blocking")
    # A node that blocks its thread between steps: the interrupt lands at a step's end.
    flow["3"] = {
        "class_type": "Progress",
        "inputs": {"value": ["1", 0], "steps": 4, "seconds_per_step": 0.5},
    }
    flow["2"]["inputs"]["images"] = ["3", 0]
    async with served.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(flow))
        await until_status(job, "running")
        stream = job.events()
        first = await anext(stream)
        assert isinstance(first, StatusChange) and first.status == "running"
        assert (await job.cancel()).status == "canceling"
        async with asyncio.timeout(20):
            rest = [e.status async for e in stream if isinstance(e, StatusChange)]
        assert rest[-1] == "canceled" and set(rest) <= {"canceling", "canceled"}
        assert (await job.refresh()).status == "canceled"
