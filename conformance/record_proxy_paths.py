"""Record what a real ComfyUI answers on the path comfy-api-proxy 0.1.6 takes to cancel
a running job, into tests/data/comfyui-reference/proxy-paths/.

The proxy submits with `prompt_id` = `client_id` = the job id, listens on
`/ws?clientId=<job id>` (sending `feature_flags` first), polls `GET /history/{id}` then
`GET /queue`, and cancels with `POST /api/jobs/{id}/cancel`. ComfyUI 0.3.64 has no such
route, so the running prompt is then stopped the way that version can: `POST /interrupt
{prompt_id}`. The recording is what a v2 proxy reads once the prompt is stopped.

Usage: python conformance/record_proxy_paths.py http://127.0.0.1:8188
(a ComfyUI started with the testing pack in its custom_nodes, for TestSleep).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp

OUT = Path(__file__).resolve().parents[1] / "tests/data/comfyui-reference/proxy-paths"


def running_prompt(color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "TestSleep", "inputs": {"value": ["1", 0], "seconds": 5.0}},
        "3": {
            "class_type": "SaveImage",
            "inputs": {"images": ["2", 0], "filename_prefix": "proxy_cancel"},
        },
    }


async def http(
    session: aiohttp.ClientSession, url: str, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    async with session.request(method, url + path, json=body) as response:
        step: dict[str, Any] = {"kind": "http", "method": method, "path": path}
        if body is not None:
            step["request_json"] = body
        step["status"] = response.status
        step["response_content_type"] = response.headers.get("Content-Type")
        if response.content_type == "application/json":
            step["response_json"] = await response.json()
        else:
            step["response_text"] = await response.text()
        return step


async def frames_until(ws: aiohttp.ClientWebSocketResponse, job: str, end: str) -> list[Any]:
    """Text frames until one of type `end` for `job` (progress folded to its first)."""
    got: list[Any] = []
    while True:
        message = json.loads((await ws.receive(timeout=30)).data)
        if message["type"] == "progress" and got and got[-1]["type"] == "progress":
            continue
        got.append(message)
        data = message.get("data") or {}
        if message["type"] == end and data.get("prompt_id") == job:
            return got


async def record(url: str) -> dict[str, Any]:
    job = str(uuid.uuid4())
    prompt = running_prompt(random.randrange(1 << 24))
    steps: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"{url}/ws?clientId={job}")
        hello = {"type": "feature_flags", "data": {"supports_preview_metadata": True}}
        await ws.send_json(hello)
        steps.append({"kind": "ws_send", "client": "X", "client_id": job, "message": hello})
        body = {"prompt": prompt, "prompt_id": job, "client_id": job}
        steps.append(await http(session, url, "POST", "/prompt", body))
        frames = await frames_until(ws, job, "progress")
        steps.append({"kind": "ws", "client": "X", "client_id": job, "frames": frames})
        steps.append(await http(session, url, "GET", f"/history/{job}"))
        steps.append(await http(session, url, "GET", "/queue"))
        steps.append(await http(session, url, "POST", f"/api/jobs/{job}/cancel"))
        steps.append(await http(session, url, "POST", "/interrupt", {"prompt_id": job}))
        frames = await frames_until(ws, job, "executing")
        steps.append({"kind": "ws", "client": "X", "client_id": job, "frames": frames})
        steps.append(await http(session, url, "GET", f"/history/{job}"))
        steps.append(await http(session, url, "GET", "/queue"))
        await ws.close()
    return {
        "scenario": "cancel-running",
        "comfyui_version": "0.3.64",
        "description": (
            "The path comfy-api-proxy 0.1.6 takes to cancel a running job: submit with "
            "prompt_id = client_id, the socket under that id (feature_flags sent first), "
            "GET /history/{id} then GET /queue while it runs, POST /api/jobs/{id}/cancel "
            "(no such route in 0.3.64: 405), then POST /interrupt {prompt_id}; the frames "
            "to the end, and what /history/{id} and /queue answer after. Progress frames "
            "are folded to the first of each run."
        ),
        "steps": steps,
    }


def main() -> None:
    recorded = asyncio.run(record(sys.argv[1].rstrip("/")))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "cancel-running.json"
    path.write_text(json.dumps(recorded, indent=1) + "\n", "utf-8")
    print(path)


if __name__ == "__main__":
    main()
