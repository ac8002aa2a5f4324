"""SaveLatent: a LATENT value written as ComfyUI writes it, with ComfyUI's names; and
the latent and video files a real ComfyUI wrote, read back."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load

from comfyfleet import latents
from comfyfleet.fanout.video import video_from_bytes
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.core.latent import SaveLatent
from tests.comfyui_replay import case_prompt, load_case


def test_saves_a_latent_file_with_comfyui_names_and_the_prompt(folders: Folders) -> None:
    samples = np.random.default_rng(3).standard_normal((2, 4, 8, 8), dtype=np.float32)
    prompt = {"1": {"class_type": "SeededLatent", "inputs": {"seed": 3}}}
    save = SaveLatent().save
    first = asyncio.run(save({"samples": samples}, "latents/run_%width%", prompt, {"a": 1}))
    second = asyncio.run(save({"samples": samples}, "latents/run_%width%", prompt))
    names = [out["ui"]["latents"][0]["filename"] for out in (first, second)]
    assert names == ["run_0_00001_.latent", "run_0_00002_.latent"]  # no size in the name
    assert first["ui"]["latents"][0] | {"filename": ""} == {
        "filename": "",
        "subfolder": "latents",
        "type": "output",
    }
    data = (folders.output / "latents" / names[0]).read_bytes()
    assert np.array_equal(latents.decode(data)["samples"], samples)
    tensors = load(data)
    assert sorted(tensors) == ["latent_format_version_0", "latent_tensor"]
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert json.loads(header["__metadata__"]["prompt"]) == prompt
    assert header["__metadata__"]["a"] == "1"


def test_refuses_what_is_not_a_latent_and_a_prefix_outside_the_output_folder(
    folders: Folders,
) -> None:
    save = SaveLatent().save
    with pytest.raises(latents.LatentError):
        asyncio.run(save({"samples": np.zeros((4, 8, 8), np.float32)}, "x"))
    with pytest.raises(latents.LatentError):
        asyncio.run(save(np.zeros((1, 4, 8, 8), np.float32), "x"))
    with pytest.raises(ValueError, match="outside"):
        asyncio.run(save({"samples": np.zeros((1, 4, 8, 8), np.float32)}, "../../escape"))
    assert not any(folders.output.rglob("*"))


# What a real ComfyUI 0.3.64 did with SaveLatent (and SaveVideo), recorded in
# tests/data/comfyui-fleet/: the files it wrote are what a child on a ComfyUI backend
# hands back to its parent.


def recorded_file(case: dict[str, Any], suffix: str) -> bytes:
    (key,) = [k for k in case["files"] if k.endswith(suffix)]
    return base64.b64decode(case["files"][key])


def test_save_latent_is_described_and_answers_as_comfyui_does(folders: Folders) -> None:
    case = load_case("save-latent")
    node = build_registry().get("SaveLatent")
    assert node is not None
    assert json.loads(json.dumps(node.object_info())) == case["object_info"]["SaveLatent"]
    inputs = case_prompt("save-latent")["2"]["inputs"]
    samples = {"samples": np.zeros((2, 4, 8, 8), dtype=np.float32)}
    ours = asyncio.run(SaveLatent().save(samples, inputs["filename_prefix"]))
    assert ours["ui"] == case["history"]["outputs"]["2"]
    executed = [f for f in case["frames"] if f.get("type") == "executed"]
    assert executed[0]["data"]["output"] == ours["ui"]


def test_a_latent_file_comfyui_wrote_is_read_as_its_latent() -> None:
    value = latents.decode(recorded_file(load_case("save-latent"), ".latent"))
    assert value["samples"].shape == (2, 4, 8, 8) and not value["samples"].any()


def test_a_video_file_comfyui_wrote_is_read_as_its_video() -> None:
    video = video_from_bytes(recorded_file(load_case("save-video"), ".mp4"))
    assert (video.format, video.get_dimensions(), video.frames, video.fps) == (
        "mp4",
        (64, 64),
        4,
        8.0,
    )
