"""comfy-sdk against a gateway whose only lane is a real ComfyUI 0.3.64 backend (with the
companion pack and ComfyUI's own testing nodes): run, an asset into LoadImage, events
and cancel, each job run by that ComfyUI and shown by `/api/jobs` and the dashboard's
`/api/fleet/status`.

Needs COMFYUI_DIR and COMFY_VENV (tests/real_comfyui.py); skipped without them.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from comfy_sdk import AsyncJob, AsyncOutput, OutputReady, Progress, StatusChange, Workflow
from PIL import Image

from tests.integration.api_v2.conftest import Served, image_workflow, serve
from tests.real_comfyui import comfyui_with_pack, needs_comfyui

pytestmark = needs_comfyui

BACKEND = "comfyui-0"
PNG = b"\x89PNG\r\n\x1a\n"


def sleeping(flow: dict[str, Any], seconds: float) -> dict[str, Any]:
    """`flow` with ComfyUI's TestSleep (progress every 10 ms, interruptible) before its
    SaveImage."""
    flow = {key: {**node, "inputs": dict(node["inputs"])} for key, node in flow.items()}
    flow["9"] = {"class_type": "TestSleep", "inputs": {"value": ["1", 0], "seconds": seconds}}
    flow["2"]["inputs"]["images"] = ["9", 0]
    return flow


@pytest.fixture
async def on_comfyui(tmp_path: Path) -> AsyncIterator[Served]:
    async with comfyui_with_pack(
        tmp_path / "comfyui", {}, ready_node="TestSleep", testing_nodes=True
    ) as url:
        backend = {"url": url, "name": BACKEND}
        async for served in serve(tmp_path, local_slots=0, backends=(backend,)):
            async with asyncio.timeout(60):
                while True:
                    _, _, listed = await served.call("GET", "/api/fleet/backends")
                    [state] = listed["backends"]
                    if state["state"] == "up" and "TestSleep" in (await node_classes(served)):
                        break
                    await asyncio.sleep(0.2)
            yield served


async def node_classes(served: Served) -> set[str]:
    _, _, info = await served.call("GET", "/object_info")
    return set(info)


async def ran_on_the_backend(served: Served, job_id: str) -> None:
    """The job is ComfyUI's (its history entry came from there) and the fleet lists it."""
    _, _, listed = await served.call("GET", f"/api/jobs/{job_id}")
    assert listed["status"] == "completed"
    _, _, history = await served.call("GET", f"/history/{job_id}")
    assert history[job_id]["status"]["status_str"] == "success"
    _, _, fleet = await served.call("GET", "/api/fleet/status")
    assert job_id in [f["id"] for f in fleet["recent"]]


async def until_running(served: Served, job: AsyncJob) -> None:
    """Running on the backend (not only sent to it): the dashboard shows it there."""
    async with asyncio.timeout(30):
        while True:
            _, _, fleet = await served.call("GET", "/api/fleet/status")
            running = [r for r in fleet["running"] if r["id"] == job.id]
            if running and running[0]["state"] == "running":
                assert running[0]["lane"] == f"backend:{BACKEND}"
                return
            await asyncio.sleep(0.1)


async def test_run_on_a_comfyui_backend(
    on_comfyui: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with on_comfyui.client(monkeypatch) as comfy:
        job = await comfy.run(Workflow(image_workflow("on-comfyui")), timeout=60)
        assert job.status == "succeeded"
        [output] = job.outputs
        assert output.node_id == "2" and output.name.startswith("on-comfyui")
        data = await output.to_bytes()
        assert data.startswith(PNG)
        assert Image.open(io.BytesIO(data)).size == (16, 8)
    await ran_on_the_backend(on_comfyui, job.id)


async def test_an_asset_into_load_image_on_a_comfyui_backend(
    on_comfyui: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    png = io.BytesIO()
    Image.new("RGB", (6, 4), (200, 30, 90)).save(png, "PNG")
    flow = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
        "3": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "in"}},
    }
    async with on_comfyui.client(monkeypatch) as comfy:
        workflow = Workflow(flow)
        workflow.set_input("1", "image", comfy.assets.from_bytes(png.getvalue(), filename="a.png"))
        job = await comfy.run(workflow, timeout=60)
        assert job.status == "succeeded"
        [output] = job.outputs
        saved = Image.open(io.BytesIO(await output.to_bytes())).convert("RGB")
        assert saved.size == (6, 4)
        inverted = (255 - 200, 255 - 30, 255 - 90)  # ComfyUI's float maths may round down
        pixel = saved.getpixel((0, 0))
        assert isinstance(pixel, tuple)
        assert all(abs(a - b) <= 1 for a, b in zip(pixel, inverted, strict=True))
    await ran_on_the_backend(on_comfyui, job.id)


async def test_events_from_a_comfyui_backend(
    on_comfyui: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with on_comfyui.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(sleeping(image_workflow("events"), 1.0)))
        seen: list[Any] = []
        async with asyncio.timeout(60):
            async for event in job.events():
                seen.append(event)
        statuses = [e.status for e in seen if isinstance(e, StatusChange)]
        assert "running" in statuses and statuses[-1] == "succeeded"
        progress = [e for e in seen if isinstance(e, Progress)]
        assert any(p.current_node == "9" for p in progress)
        assert all(0.0 <= p.value <= 1.0 for p in progress)
        [ready] = [e for e in seen if isinstance(e, OutputReady)]
        assert isinstance(ready.output, AsyncOutput)
        assert (await ready.output.to_bytes()).startswith(PNG)
    await ran_on_the_backend(on_comfyui, job.id)


async def test_cancel_a_job_running_on_a_comfyui_backend(
    on_comfyui: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with on_comfyui.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(sleeping(image_workflow("never"), 120.0)))
        await until_running(on_comfyui, job)
        await job.cancel()
        assert job.status in ("canceling", "canceled")
        await job.wait(timeout=20)
        assert job.status == "canceled" and job.outputs == []
    _, _, listed = await on_comfyui.call("GET", f"/api/jobs/{job.id}")
    assert listed["status"] in ("cancelled", "interrupted")
    _, _, queue = await on_comfyui.call("GET", "/queue")
    assert queue == {"queue_running": [], "queue_pending": []}
