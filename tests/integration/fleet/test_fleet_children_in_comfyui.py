""" "Run on the Fleet" inside a real ComfyUI (the companion pack): a prompt queued on
that ComfyUI sends its children to the gateway `COMFYFLEET_GATEWAY_URL` names, and
collects their images (latents, videos) there.

Needs COMFYUI_DIR and COMFY_VENV (as `make conformance` does); skipped without them.
"""

from __future__ import annotations

import io
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from comfyfleet import latents
from comfyfleet.children.remote import ORIGIN_KEY, URL_ENV
from comfyfleet.fanout.video import video_from_bytes
from tests.integration.fleet.test_fleet_children import (
    COLOR,
    INVERT,
    fleet_prompt,
    tiles_prompt,
)
from tests.integration.gateway.wire import poll, serve
from tests.real_comfyui import comfyui_with_pack, needs_comfyui

pytestmark = needs_comfyui


async def ended_in_comfyui(
    session: aiohttp.ClientSession, url: str, prompt_id: str, timeout: float
) -> dict[str, Any]:
    """The history entry of `prompt_id` in the ComfyUI at `url`, once it has ended."""
    entry: dict[str, Any] = {}

    async def ended() -> bool:
        async with session.get(f"{url}/history/{prompt_id}") as r:
            entry.update((await r.json()).get(prompt_id) or {})
        return entry.get("status", {}).get("completed") is not None

    await poll(ended, what="the prompt to end in ComfyUI", timeout=timeout)
    return entry


def parent_prompt(count: int) -> dict[str, Any]:
    """fleet_prompt with ImageInvert (a node every ComfyUI has) in place of Sleep."""
    prompt = fleet_prompt(count, 0.0)
    prompt["2"] = {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}
    return prompt


@pytest.mark.timeout(300)
async def test_a_comfyui_prompt_runs_its_children_on_the_gateway(tmp_path: Path) -> None:
    async with serve(tmp_path / "gateway", local_slots=4) as served:
        env = {URL_ENV: served.url}
        async with (
            comfyui_with_pack(tmp_path / "comfyui", env, "Run on the Fleet") as url,
            aiohttp.ClientSession() as session,
        ):
            async with session.post(f"{url}/prompt", json={"prompt": parent_prompt(4)}) as r:
                assert r.status == 200, await r.text()
                prompt_id = (await r.json())["prompt_id"]
            entry = await ended_in_comfyui(session, url, prompt_id, 120)
            assert entry["status"]["status_str"] == "success", entry["status"]
            found = []
            for ref in entry["outputs"]["5"]["images"]:
                async with session.get(f"{url}/view", params=ref) as r:
                    pixel = np.asarray(Image.open(io.BytesIO(await r.read())).convert("RGB"))
                found.append(tuple(int(v) for v in pixel[0, 0]))
            colors = [COLOR + i for i in range(4)]
            inverted = [tuple(255 - (c >> s & 0xFF) for s in (16, 8, 0)) for c in colors]
            assert all(abs(a - b) <= 1 for f, e in zip(found, inverted) for a, b in zip(f, e))
            jobs = (await served.get("/api/jobs?limit=50"))["jobs"]
            details = [await served.get(f"/api/jobs/{job['id']}") for job in jobs]
            origins = sorted(
                d["extra_data"][ORIGIN_KEY]["index"]
                for d in details
                if ORIGIN_KEY in d["extra_data"]
            )
            assert origins == [0, 1, 2, 3]


@pytest.mark.timeout(400)
async def test_children_run_on_four_comfyui_backends(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(
                comfyui_with_pack(tmp_path / f"comfyui{i}", {}, "TestSleep", testing_nodes=True)
            )
            for i in range(4)
        ]
        backends = tuple({"url": url, "name": f"c{i}"} for i, url in enumerate(urls))
        served = await stack.enter_async_context(
            serve(tmp_path / "gateway", local_slots=1, backends=backends)
        )

        async def all_up() -> bool:
            listed = (await served.get("/api/fleet/backends"))["backends"]
            return [b["state"] for b in listed] == ["up"] * 4

        await poll(all_up, what="four ComfyUI backends up", timeout=60)
        prompt = parent_prompt(8)
        prompt["2"] = {"class_type": "TestSleep", "inputs": {"value": ["1", 0], "seconds": 1.0}}
        started = time.monotonic()
        answer = await served.post("/prompt", {"prompt": prompt})
        assert answer.status == 200, answer.text
        parent = answer.json["prompt_id"]

        async def ended() -> bool:
            job = await served.get(f"/api/jobs/{parent}")
            return job["status"] in ("completed", "failed")

        await poll(ended, what="the parent to end", timeout=120)
        elapsed = time.monotonic() - started
        entry = (await served.get(f"/history/{parent}"))[parent]
        assert entry["status"]["status_str"] == "success", entry["status"]
        jobs = (await served.get("/api/jobs?limit=50"))["jobs"]
        children = [job for job in jobs if job["parent"] == parent]
        assert len(children) == 8 and {c["lane"] for c in children} == {
            f"backend:c{i}" for i in range(4)
        }
        assert len(entry["outputs"]["5"]["images"]) == 8
        assert elapsed < 6.0, elapsed  # serial: 8 s; BENCHMARKS.md has the figure


def latents_and_videos_prompt() -> dict[str, Any]:
    """Latents and videos made by children on the fleet, collected in ComfyUI (whose own
    SaveLatent and SaveVideo take what the collectors give as ComfyUI's values)."""
    return {
        "1": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1},
        },
        "2": {
            "class_type": "Run on the Fleet",
            "inputs": {"latent": ["1", 0], "count": 1, "vary": "batch_size", "values": "[1, 2]"},
        },
        "3": {
            "class_type": "Collect Latents from the Fleet",
            "inputs": {"batch": ["2", 0], "failure_mode": "fail_fast"},
        },
        "4": {
            "class_type": "SaveLatent",
            "inputs": {"samples": ["3", 0], "filename_prefix": "collected/latent"},
        },
        "5": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 4, "color": COLOR},
        },
        "6": {"class_type": "CreateVideo", "inputs": {"images": ["5", 0], "fps": 8.0}},
        "7": {
            "class_type": "Run on the Fleet",
            "inputs": {"video": ["6", 0], "count": 2, "vary": "color"},
        },
        "8": {
            "class_type": "Collect Videos from the Fleet",
            "inputs": {"batch": ["7", 0], "failure_mode": "fail_fast"},
        },
        "9": {
            "class_type": "SaveVideo",
            "inputs": {
                "video": ["8", 0],
                "filename_prefix": "collected/clip",
                "format": "auto",
                "codec": "auto",
            },
        },
    }


@pytest.mark.timeout(400)
async def test_latents_and_videos_come_back_from_children_on_a_comfyui_backend(
    tmp_path: Path,
) -> None:
    """A prompt in ComfyUI A sends its children to the gateway, which runs them on
    ComfyUI B (its engine has no EmptyLatentImage or CreateVideo)."""
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(
            comfyui_with_pack(tmp_path / "comfyui-b", {}, "CreateVideo")
        )
        served = await stack.enter_async_context(
            serve(tmp_path / "gateway", local_slots=1, backends=({"url": backend, "name": "b"},))
        )
        url = await stack.enter_async_context(
            comfyui_with_pack(tmp_path / "comfyui-a", {URL_ENV: served.url}, "Run on the Fleet")
        )
        session = await stack.enter_async_context(aiohttp.ClientSession())
        body = {"prompt": latents_and_videos_prompt()}
        async with session.post(f"{url}/prompt", json=body) as r:
            assert r.status == 200, await r.text()
            prompt_id = (await r.json())["prompt_id"]
        entry = await ended_in_comfyui(session, url, prompt_id, 240)
        assert entry["status"]["status_str"] == "success", entry["status"]

        async def kept(ref: dict[str, Any]) -> bytes:
            async with session.get(f"{url}/view", params=ref) as r:
                assert r.status == 200, ref
                return await r.read()

        (latent_ref,) = entry["outputs"]["4"]["latents"]
        samples = latents.decode(await kept(latent_ref))["samples"]
        assert samples.shape == (3, 4, 8, 8)  # the children's batches of 1 and 2, in order
        clips = entry["outputs"]["9"]["images"]
        assert len(clips) == 2  # ComfyUI's SaveVideo ran once per video of the list
        for ref in clips:
            video = video_from_bytes(await kept(ref))
            assert (video.get_dimensions(), video.frames) == ((64, 64), 4)
        jobs = (await served.get("/api/jobs?limit=50"))["jobs"]
        assert sorted(job["lane"] for job in jobs) == ["backend:b"] * 4


@pytest.mark.timeout(300)
async def test_interrupting_the_comfyui_parent_cancels_its_children(tmp_path: Path) -> None:
    async with serve(tmp_path / "gateway", local_slots=4) as served:
        env = {URL_ENV: served.url}
        async with (
            comfyui_with_pack(
                tmp_path / "comfyui", env, "Run on the Fleet", testing_nodes=True
            ) as url,
            aiohttp.ClientSession() as session,
        ):
            prompt = parent_prompt(3)
            prompt["2"] = {"class_type": "TestSleep", "inputs": {"value": ["1", 0], "seconds": 60}}
            async with session.post(f"{url}/prompt", json={"prompt": prompt}) as r:
                assert r.status == 200, await r.text()
                prompt_id = (await r.json())["prompt_id"]

            async def children() -> list[dict[str, Any]]:
                listed = (await served.get("/api/jobs?limit=50"))["jobs"]
                return [j for j in listed if j["id"] != prompt_id]

            async def running() -> bool:
                return [j["status"] for j in await children()] == ["in_progress"] * 3

            await poll(running, what="three children running on the gateway", timeout=120)
            async with session.post(f"{url}/interrupt", json={}) as r:
                assert r.status == 200
            interrupted = time.monotonic()

            async def cancelled() -> bool:
                return [j["status"] for j in await children()] == ["cancelled"] * 3

            await poll(cancelled, what="every child cancelled", timeout=30)
            assert time.monotonic() - interrupted < 5.0  # 0.05 s in three runs, quiet machine

            status = (await ended_in_comfyui(session, url, prompt_id, 30))["status"]
            assert [m[0] for m in status["messages"]][-1] == "execution_interrupted", status


@pytest.mark.timeout(300)
async def test_tiles_from_a_comfyui_prompt_run_on_the_gateway_and_are_removed(
    tmp_path: Path,
) -> None:
    picture = np.random.default_rng(3).integers(0, 256, (30, 44, 3), dtype=np.uint8)
    async with serve(tmp_path / "gateway", local_slots=4) as served:
        env = {URL_ENV: served.url}
        async with (
            comfyui_with_pack(tmp_path / "comfyui", env, "Tiles on the Fleet") as url,
            aiohttp.ClientSession() as session,
        ):
            buffer = io.BytesIO()
            Image.fromarray(picture).save(buffer, format="PNG")
            form = aiohttp.FormData()
            form.add_field("image", buffer.getvalue(), filename="in_comfyui.png")
            async with session.post(f"{url}/upload/image", data=form) as r:
                assert r.status == 200, await r.text()
            prompt = tiles_prompt("in_comfyui.png", INVERT, overlap=4)
            async with session.post(f"{url}/prompt", json={"prompt": prompt}) as r:
                assert r.status == 200, await r.text()
                prompt_id = (await r.json())["prompt_id"]
            entry = await ended_in_comfyui(session, url, prompt_id, 120)
            assert entry["status"]["status_str"] == "success", entry["status"]
            (ref,) = entry["outputs"]["5"]["images"]
            async with session.get(f"{url}/view", params=ref) as r:
                saved = np.asarray(Image.open(io.BytesIO(await r.read())).convert("RGB"))
            assert np.abs(saved.astype(int) - (255 - picture.astype(int))).max() <= 1
            jobs = (await served.get("/api/jobs?limit=50"))["jobs"]
            assert len(jobs) == 4 and {j["status"] for j in jobs} == {"completed"}
            # The tiles were the gateway's input files while their children ran.
            assert not list((tmp_path / "gateway" / "input").glob("fleet-tile-*"))
