"""A symlink inside a data folder that leads out of it is refused by every file access,
as `/view` and uploads refuse it: LoadImage, SaveImage and retention too (real server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.gateway.wire import save_prompt, serve


def load_prompt(image: str) -> dict[str, object]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }


@pytest.mark.parametrize("image", ["link.png", "linkdir/secret.png"])
async def test_load_image_refuses_a_symlink_leading_out_of_the_input_folder(
    tmp_path: Path, image: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGB", (4, 4), (9, 9, 9)).save(outside / "secret.png")
    async with serve(tmp_path / "data", local_slots=1) as served:
        inputs = served.gateway.folders.input
        os.symlink(outside / "secret.png", inputs / "link.png")
        os.symlink(outside, inputs / "linkdir")

        reply = await served.post("/prompt", {"prompt": load_prompt(image)})

        # As for a missing file: ComfyUI's custom validation error on the input.
        assert reply.status == 400, reply.text
        assert reply.json["error"]["type"] == "prompt_outputs_failed_validation"
        (error,) = reply.json["node_errors"]["1"]["errors"]
        assert error["type"] == "custom_validation_failed"
        assert error["details"] == f"image - Invalid image file: {image}"
        # Nor is the link offered as a choice.
        info = await served.get("/object_info/LoadImage")
        assert "link.png" not in info["LoadImage"]["input"]["required"]["image"][0]


async def test_load_image_follows_a_symlink_that_stays_inside(tmp_path: Path) -> None:
    async with serve(tmp_path / "data", local_slots=1) as served:
        inputs = served.gateway.folders.input
        (inputs / "real").mkdir()
        Image.new("RGB", (4, 4), (9, 9, 9)).save(inputs / "real" / "pic.png")
        os.symlink(inputs / "real" / "pic.png", inputs / "alias.png")
        sock = await served.connect()
        prompt_id = await served.submit(load_prompt("alias.png"), sock.client_id)
        await sock.done(prompt_id)
        assert (await served.history_entry(prompt_id))["status"]["status_str"] == "success"


async def test_save_image_refuses_to_write_through_a_symlinked_subfolder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with serve(tmp_path / "data", local_slots=1) as served:
        os.symlink(outside, served.gateway.folders.output / "linkdir")
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(5, "linkdir/x"), sock.client_id)
        await sock.done(prompt_id)

        assert os.listdir(outside) == []
        job = await served.job(prompt_id)
        assert job["status"] == "failed"
        assert job["execution_error"]["node_type"] == "SaveImage"
        assert "outside the output folder" in job["execution_error"]["exception_message"]


async def test_retention_does_not_delete_through_a_symlinked_subfolder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    async with serve(tmp_path / "data", local_slots=1, history_max_entries=1) as served:
        sock = await served.connect()
        first, second = await served.run_in_turn(
            sock, [save_prompt(6, "sub/kept"), save_prompt(7, "other")]
        )
        output = served.gateway.folders.output
        (saved,) = (await served.history_entry(first))["outputs"]["2"]["images"]
        # The subfolder is swapped for a link to a folder outside holding the same name.
        os.rename(output / "sub", outside)
        os.symlink(outside, output / "sub")

        assert await served.gateway.prune_once() == 0

        assert (outside / saved["filename"]).exists()
        assert list(await served.get("/history")) == [second]
