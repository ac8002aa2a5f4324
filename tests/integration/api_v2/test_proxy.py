"""Comfy's own v2-to-ComfyUI proxy (comfy-api-proxy 0.1.6) in front of a real gateway,
driven by comfy-sdk: run, an uploaded asset into LoadImage, events, and cancel.

The proxy sees the gateway only through ComfyUI's routes: `/upload/image`, `/prompt`,
`/history/{id}` then `/queue` for a job's status, `/ws` for events and
`POST /api/jobs/{id}/cancel`. A job it knows that is in neither history nor the queue
is `expired`.

Its status read is two requests, so a prompt that ends between them reads `expired`
whatever the server (it happens with a real ComfyUI 0.3.64 too). So these tests wait
through events (their end comes once the history entry is written) and give each
prompt a short sleep, so that no status read meets its end.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from comfy_api_proxy.app import make_app
from comfy_sdk import AsyncComfy, AsyncJob, Event, Progress, StatusChange, Workflow
from PIL import Image

from tests.integration.api_v2.conftest import Served, image_workflow, serve, slow_workflow


@dataclass
class Proxied:
    gateway: Served
    proxy: TestServer

    def client(self, monkeypatch: pytest.MonkeyPatch) -> AsyncComfy:
        """The SDK pointed at the proxy (COMFY_BASE_URL), as a self-hosted user is."""
        monkeypatch.setenv("COMFY_BASE_URL", f"http://127.0.0.1:{self.proxy.port}")
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        return AsyncComfy(timeout=30.0)


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[Proxied]:
    async for served in serve(tmp_path, local_slots=2):
        proxy = TestServer(make_app(served.url), host="127.0.0.1")
        await proxy.start_server()
        try:
            yield Proxied(served, proxy)
        finally:
            await proxy.close()


def sleeping(flow: dict[str, Any], seconds: float) -> dict[str, Any]:
    """`flow` with a Sleep of `seconds` before its SaveImage (node "2")."""
    flow["9"] = {"class_type": "Sleep", "inputs": {"value": flow["2"]["inputs"]["images"]}}
    flow["9"]["inputs"]["seconds"] = seconds
    flow["2"]["inputs"]["images"] = ["9", 0]
    return flow


async def to_the_end(job: AsyncJob) -> list[Event]:
    async with asyncio.timeout(30):
        return [event async for event in job.events()]


async def test_run_through_the_proxy(proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    # Polling (the SDK's run): 0.85 s ends between its reads at 0.5 s and 1.25 s.
    async with proxied.client(monkeypatch) as comfy:
        job = await comfy.run(Workflow(sleeping(image_workflow("proxy"), 0.85)), timeout=30)
        [output] = job.outputs
        assert output.node_id == "2" and output.name.startswith("proxy")
        assert (await output.to_bytes()).startswith(b"\x89PNG")


async def test_an_asset_into_load_image(proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    png = io.BytesIO()
    Image.new("RGB", (6, 4), (200, 30, 90)).save(png, "PNG")
    flow = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "in"}},
    }
    async with proxied.client(monkeypatch) as comfy:
        workflow = Workflow(sleeping(flow, 0.3))
        workflow.set_input("1", "image", comfy.assets.from_bytes(png.getvalue(), filename="a.png"))
        job = await comfy.submit(workflow)
        events = await to_the_end(job)
        assert isinstance(events[-1], StatusChange) and events[-1].status == "succeeded"
        assert (await job.refresh()).status == "succeeded"
        [output] = job.outputs
        saved = Image.open(io.BytesIO(await output.to_bytes()))
        assert saved.size == (6, 4) and saved.convert("RGB").getpixel((0, 0)) == (200, 30, 90)


async def test_events_through_the_proxy(proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxied.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(sleeping(image_workflow("events"), 0.5)))
        events = await to_the_end(job)
        assert isinstance(events[0], StatusChange) and events[0].status in ("queued", "running")
        assert any(isinstance(e, Progress) and 0.0 <= e.value <= 1.0 for e in events)
        # The stream stops at its final status; the proxy sends the outputs after it.
        assert isinstance(events[-1], StatusChange) and events[-1].status == "succeeded"
        [output] = (await job.refresh()).outputs
        assert (await output.to_bytes()).startswith(b"\x89PNG")


async def test_cancel_a_running_job_through_the_proxy(
    proxied: Proxied, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with proxied.client(monkeypatch) as comfy:
        job = await comfy.submit(Workflow(slow_workflow(60)))
        async with asyncio.timeout(20):
            while (await job.refresh()).status != "running":
                await asyncio.sleep(0.05)
        stream = asyncio.create_task(to_the_end(job))
        await asyncio.sleep(0.2)  # the stream is open
        # The answer is a status read made as the interrupt lands: open to the race above.
        await job.cancel()
        events = await stream
        assert isinstance(events[-1], StatusChange) and events[-1].status == "canceled"
        assert (await job.refresh()).status == "canceled"
