"""comfyfleet's VIDEO results in a real ComfyUI's own video nodes (Save Video, Get Video
Components), the companion pack loaded as `bench/bench_pack.py` loads it.

Needs a ComfyUI checkout with its venv: COMFYUI_DIR and COMFY_VENV (as `make
conformance` does); skipped without them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from comfyfleet.fanout.mp4 import read_info
from tests.integration.fanout.conftest import KEY, start_emulator
from tests.real_comfyui import comfyui_with_pack, needs_comfyui

pytestmark = needs_comfyui
VIDEO = {"model": "sora-2", "seconds": "4", "size": "1280x720"}


def video_graph(url: str) -> dict[str, Any]:
    """A job that works and one that fails with skip_error on, into ComfyUI's nodes."""

    def settings(key: str) -> dict[str, Any]:
        inputs = {"base_url": url, "api_key": f"env:{key}", "poll_interval": 0.1}
        return {"class_type": "APISettings", "inputs": inputs}

    def submit(seed: int, api: str, **extra: Any) -> dict[str, Any]:
        inputs = {**VIDEO, "prompt": "a pond", "seed": seed, "api_config": [api, 0], **extra}
        return {"class_type": "Concurrent Submit | OpenAIVideo", "inputs": inputs}

    def save(source: list[Any], prefix: str, **choice: str) -> dict[str, Any]:
        inputs = {"video": source, "filename_prefix": f"video/{prefix}"}
        return {
            "class_type": "SaveVideo",
            "inputs": {"format": "auto", "codec": "auto", **inputs, **choice},
        }

    tasks = {"task_1": ["s1", 0], "task_2": ["s2", 0], "failure_mode": "fail_fast"}
    return {
        "api": settings("VIDEO_TEST_KEY"),
        "wrong": settings("VIDEO_WRONG_KEY"),
        "s1": submit(1, "api"),
        "s2": submit(2, "wrong", skip_error=True),
        "c": {"class_type": "Concurrent Collect Videos (10)", "inputs": tasks},
        "good": save(["c", 0], "good"),
        "reencoded": save(["c", 0], "reencoded", format="mp4", codec="h264"),
        "skipped": save(["c", 1], "skipped"),
        "parts": {"class_type": "GetVideoComponents", "inputs": {"video": ["c", 1]}},
        "frames": {
            "class_type": "SaveImage",
            "inputs": {"images": ["parts", 0], "filename_prefix": "f"},
        },
    }


async def finished(session: aiohttp.ClientSession, url: str, prompt_id: str) -> dict[str, Any]:
    async with asyncio.timeout(120):
        while True:
            async with session.get(f"{url}/history/{prompt_id}") as response:
                found: dict[str, Any] = await response.json()
            if (
                prompt_id in found
                and found[prompt_id].get("status", {}).get("completed") is not None
            ):
                entry: dict[str, Any] = found[prompt_id]
                return entry
            await asyncio.sleep(0.2)


@pytest.mark.timeout(300)
async def test_comfyuis_video_nodes_take_comfyfleets_videos(tmp_path: Path) -> None:
    emulator = await start_emulator(latency=0.2)
    keys = {"VIDEO_TEST_KEY": KEY, "VIDEO_WRONG_KEY": "not-the-key"}
    try:
        async with (
            comfyui_with_pack(tmp_path, keys, ready_node="OpenAIVideo") as url,
            aiohttp.ClientSession() as session,
        ):
            async with session.post(
                f"{url}/prompt", json={"prompt": video_graph(emulator.url)}
            ) as r:
                answer = await r.json()
                assert r.status == 200, answer
            entry = await finished(session, url, answer["prompt_id"])
    finally:
        await emulator.server.close()
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    report = json.loads(outputs["c"]["text"][0])
    assert report["counts"] == {"success": 1, "skipped_error": 1, "not_connected": 8}
    folder = tmp_path / "base" / "output"

    def saved(node: str) -> Any:
        [item] = outputs[node]["images"]
        return read_info((folder / item["subfolder"] / item["filename"]).read_bytes())

    sizes = [
        (saved(n).width, saved(n).height, saved(n).frames) for n in ("good", "reencoded", "skipped")
    ]
    assert sizes == [(1280, 720, 96), (1280, 720, 96), (512, 512, 8)]
    frames = [
        np.asarray(Image.open(folder / item["filename"])) for item in outputs["frames"]["images"]
    ]
    assert len(frames) == 8 and all(
        frame.shape == (512, 512, 3) and frame.min() == 255 for frame in frames
    )
