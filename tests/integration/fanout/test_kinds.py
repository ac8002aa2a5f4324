"""Every kind of job through the pools: OpenAI-compatible, local nodes, video, a 5xx storm."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from comfyfleet.nodes import build_registry
from tests.emulators import Emulator
from tests.integration.fanout.conftest import Graph, MakeRig, Rig
from tests.integration.fanout.test_concurrency import run, status_of


def openai_inputs(graph: Graph, text: str, seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "prompt": text,
        "model": "gpt-image-1",
        "size": "512x512",
        "quality": "auto",
        "response_format": "auto",
        "seed": seed,
        "api_config": [graph.settings, 0],
        **extra,
    }


async def test_openai_generations_and_edits_in_one_batch(rig: Rig, emulator: Emulator) -> None:
    graph = Graph(emulator.url)
    graph.prompt["img"] = {
        "class_type": "EmptyImage",
        "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 0x336699},
    }
    submit = "Concurrent Submit | OpenAIImage"
    graph.prompt["gen"] = {"class_type": submit, "inputs": openai_inputs(graph, "sky", 1)}
    graph.prompt["url"] = {
        "class_type": submit,
        "inputs": openai_inputs(graph, "sea", 2, response_format="url"),
    }
    edit = openai_inputs(graph, "paint it", 3, image=["img", 0])
    graph.prompt["edit"] = {"class_type": submit, "inputs": edit}
    graph.prompt["serial"] = {"class_type": "OpenAIImage", "inputs": openai_inputs(graph, "x", 4)}
    graph.save("saved", "serial", 0)
    graph.collect("c", ["gen", "url", "edit"])
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    assert status_of(result, "c")["counts"] == {"success": 3, "not_connected": 27}
    endpoints = [s["endpoint"] for s in status_of(result, "c")["slots"][:3]]
    assert [e.rsplit("/", 1)[1] for e in endpoints] == ["generations", "generations", "edits"]
    stats = emulator.stats()
    assert stats["jobs"] == 4 and stats["downloads"] == 1  # the url answer was downloaded


async def test_any_image_node_fans_out_through_its_twin(rig: Rig, emulator: Emulator) -> None:
    graph = Graph(emulator.url)
    twins = []
    for n in range(3):
        graph.prompt[f"e{n}"] = {
            "class_type": "Concurrent Submit | EmptyImage",
            "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 0x110000 * (n + 1)},
        }
        twins.append(f"e{n}")
    graph.collect("c", twins)
    graph.save("saved", "c", 2)
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    slots = status_of(result, "c")["slots"][:3]
    assert [(s["state"], s["provider"]) for s in slots] == [("success", "local")] * 3
    assert emulator.stats()["jobs"] == 0


VIDEO_PACK = """
from comfyfleet.fanout.video import VideoFile
from comfyfleet.folders import current_folders


class MakeClip:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "clip"}), "fail": ("BOOLEAN", {})}}

    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "make"

    async def make(self, name, fail):
        if fail:
            raise RuntimeError("the encoder gave up")
        path = current_folders().temp / f"{name}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"frames")
        return (VideoFile(path, "bin", 8, 8, 24.0, 1),)


class ShowClip:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO",)}}

    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True

    def show(self, video):
        magic = video.path.read_bytes()[:8].decode("latin-1")
        shown = [type(video).__name__, video.path.name, video.placeholder, magic, video.format]
        return {"ui": {"text": shown}}


NODE_CLASS_MAPPINGS = {"MakeClip": MakeClip, "ShowClip": ShowClip}
"""


async def test_video_tasks_pass_through_and_failed_slots_get_a_blank_clip(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    pack = tmp_path / "custom_nodes"
    pack.mkdir()
    (pack / "clips.py").write_text(textwrap.dedent(VIDEO_PACK))
    rig = await make_rig(registry=build_registry(custom_nodes=[pack]))
    submit = "Concurrent Submit | MakeClip"
    prompt: dict[str, Any] = {
        "ok": {"class_type": submit, "inputs": {"name": "good", "fail": False}},
        "bad": {"class_type": submit, "inputs": {"name": "bad", "fail": True}},
        "c": {
            "class_type": "Concurrent Collect Videos (10)",
            "inputs": {"task_1": ["ok", 0], "task_2": ["bad", 0], "failure_mode": "placeholder"},
        },
    }
    prompt["show1"] = {"class_type": "ShowClip", "inputs": {"video": ["c", 0]}}
    prompt["show2"] = {"class_type": "ShowClip", "inputs": {"video": ["c", 1]}}
    result = await run(rig, prompt)
    assert result.status == "success", result.error
    report = json.loads(result.outputs["c"]["text"][0])
    assert report["slots"][0]["error"] is None, report["slots"][0]
    assert [s["state"] for s in report["slots"][:3]] == ["success", "failed", "not_connected"]
    assert report["slots"][1]["error"] == "the encoder gave up"
    # The good clip passes through unchanged; the failed slot gets a blank MP4 placeholder.
    assert result.outputs["show1"]["text"] == ["VideoFile", "good.bin", False, "frames", "bin"]
    name, placeholder, magic, kind = result.outputs["show2"]["text"][1:]
    assert name.endswith(".mp4") and placeholder is True and magic[4:] == "ftyp" and kind == "mp4"


async def test_a_storm_of_5xx_and_429_sends_no_job_twice(rig: Rig, emulator: Emulator) -> None:
    emulator.settings.latency = 0.2
    emulator.settings.fail_rate = 0.25
    emulator.settings.rate_limit = 20.0
    emulator.settings.retry_after = 0.2
    graph = Graph(emulator.url)
    graph.collect("c", [graph.submit(f"s{n}", "storm", seed=n) for n in range(12)])
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    stats = emulator.stats()
    assert stats["jobs"] == 12 and stats["duplicates"] == 0
    assert stats["failed"] + stats["rate_limited"] > 0  # there was a storm
    attempts = [s["attempts"] for s in status_of(result, "c")["slots"][:12]]
    assert sum(attempts) > 12 and np.all(np.array(attempts) >= 1)


async def test_429s_on_job_creation_leave_accepted_jobs_running(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency = 0.5
    # 10 jobs a second: the 30 submit nodes run faster than that, so some hear 429. How
    # many depends on the machine: a slow one spreads the submits over seconds, and
    # after the first 429 the provider's cooldown holds the rest.
    emulator.settings.rate_limit = 10.0
    graph = Graph(emulator.url)
    submits = [graph.submit(f"s{n}", "limited", seed=n) for n in range(30)]
    graph.collect("c", submits, mode="placeholder")
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    slots = status_of(result, "c")["slots"]
    assert [s["state"] for s in slots].count("success") == 30
    assert emulator.stats()["rate_limited"] >= 1
    # The provider's cooldown after a 429 (5 s) holds the submits that
    # were refused; it must not hold the polls and downloads of the jobs accepted
    # at once, which end about half a second after they start.
    quick = [s for s in slots if s["running_seconds"] < 2.5]
    assert len(quick) >= 10, [s["running_seconds"] for s in slots]


async def test_an_endpoint_limit_keeps_jobs_under_the_accounts_cap(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.max_active = 2  # the account refuses a third active job with a 429
    graph = Graph(emulator.url)
    graph.prompt[graph.settings]["inputs"]["max_concurrency"] = 2
    graph.collect("c", [graph.submit(f"s{n}", "capped", seed=n) for n in range(6)])
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    stats = emulator.stats()
    assert (stats["jobs"], stats["rate_limited"]) == (6, 0)
    slots = status_of(result, "c")["slots"][:6]
    assert max(s["queued_seconds"] for s in slots) >= 0.5  # three waves of 0.3 s, not one


async def test_provider_nodes_can_ask_for_images_smaller_than_512(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency = 0.05
    graph = Graph(emulator.url)
    flux = graph.flux_inputs("small", 1, resolution="0.0625 MP")
    graph.prompt["flux"] = {"class_type": "BFLFluxImage", "inputs": flux}
    small = openai_inputs(graph, "small", 2, size="256x256")
    graph.prompt["openai"] = {"class_type": "OpenAIImage", "inputs": small}
    for source in ("flux", "openai"):
        graph.prompt[f"{source}_size"] = {
            "class_type": "GetImageSize",
            "inputs": {"image": [source, 0]},
        }
        for index, side in enumerate(("width", "height")):
            shown = {"source": [f"{source}_size", index]}
            graph.prompt[f"{source}_{side}"] = {"class_type": "PreviewAny", "inputs": shown}
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    sides = {node: ui["text"] for node, ui in result.outputs.items()}
    assert sides == {
        "flux_width": ["256"],
        "flux_height": ["256"],
        "openai_width": ["256"],
        "openai_height": ["256"],
    }
