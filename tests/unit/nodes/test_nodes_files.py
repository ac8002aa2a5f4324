"""SaveImage, PreviewImage and LoadImage against real files in temporary folders."""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import numpy as np
import pytest
from PIL import Image

from comfyfleet.folders import Folders, using_folders
from comfyfleet.nodes.core.files import LoadImage, PreviewImage, SaveImage
from comfyfleet.nodes.core.images import EmptyImage, ImageInvert
from comfyfleet.nodes.core.saving import SaveTarget

PROMPT = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
}
WORKFLOW = {"nodes": [{"id": 1, "type": "EmptyImage"}], "links": [], "version": 0.4}


def _image(color: int = 0, batch: int = 1, size: int = 8) -> np.ndarray:
    return EmptyImage().generate(width=size, height=size, batch_size=batch, color=color)[0]


def test_save_image_writes_the_recorded_result(folders: Folders) -> None:
    (inverted,) = ImageInvert().invert(_image(size=64))
    result = SaveImage().save_images(inverted, "ref_success")
    assert result == {
        "ui": {
            "images": [{"filename": "ref_success_00001_.png", "subfolder": "", "type": "output"}]
        }
    }
    with Image.open(folders.output / "ref_success_00001_.png") as png:
        assert png.size == (64, 64)
        assert np.all(np.asarray(png.convert("RGB")) == 255)


def test_save_image_embeds_prompt_and_workflow(folders: Folders) -> None:
    SaveImage().save_images(_image(), "meta", prompt=PROMPT, extra_pnginfo={"workflow": WORKFLOW})
    with Image.open(folders.output / "meta_00001_.png") as png:
        text = dict(png.text)  # type: ignore[attr-defined]
    assert json.loads(text["prompt"]) == PROMPT
    assert json.loads(text["workflow"]) == WORKFLOW
    assert set(text) == {"prompt", "workflow"}


def test_save_image_continues_after_the_highest_counter(folders: Folders) -> None:
    for name in ("run_00003_.png", "run_00007_.png", "runner_00020_.png", "other_00050_.png"):
        (folders.output / name).write_bytes(b"old")
    result = SaveImage().save_images(_image(batch=2), "run")
    names = [i["filename"] for i in result["ui"]["images"]]
    assert names == ["run_00008_.png", "run_00009_.png"]
    assert (folders.output / "run_00007_.png").read_bytes() == b"old"


def test_save_image_skips_names_taken_since_the_scan(folders: Folders) -> None:
    # A name that appears between the folder scan and the write is skipped, not replaced.
    target = SaveTarget.resolve(folders.output, "race")
    assert target.next_counter() == 1
    (folders.output / "race_00001_.png").write_bytes(b"theirs")
    assert target.write_new("race", 1, b"mine") == ("race_00002_.png", 2)
    assert (folders.output / "race_00001_.png").read_bytes() == b"theirs"
    assert (folders.output / "race_00002_.png").read_bytes() == b"mine"


def test_save_image_into_prefix_subfolder(folders: Folders) -> None:
    result = SaveImage().save_images(_image(), "a/b/name")
    assert result["ui"]["images"] == [
        {"filename": "name_00001_.png", "subfolder": "a/b", "type": "output"}
    ]
    assert (folders.output / "a" / "b" / "name_00001_.png").is_file()


@pytest.mark.parametrize(
    "prefix", ["../escape", "a/../../escape", "/tmp/escape", "a/../../output2/x"]
)
def test_save_image_rejects_prefix_outside_output(folders: Folders, prefix: str) -> None:
    with pytest.raises(ValueError, match="outside the output folder"):
        SaveImage().save_images(_image(), prefix)
    assert not any(folders.output.parent.glob("escape*"))
    assert not (folders.output.parent / "output2").exists()


def test_save_image_expands_date_and_batch_number(folders: Folders) -> None:
    today = datetime.now().strftime("%Y-%m-%d")
    result = SaveImage().save_images(_image(batch=2), "%date:yyyy-MM-dd%/shot_%batch_num%")
    images = result["ui"]["images"]
    assert [i["subfolder"] for i in images] == [today, today]
    assert [i["filename"] for i in images] == ["shot_0_00001_.png", "shot_1_00002_.png"]


def test_concurrent_saves_with_one_prefix_never_collide(folders: Folders) -> None:
    def save(i: int) -> str:
        with using_folders(folders):
            result = SaveImage().save_images(_image(color=i << 16, size=4), "same/prefix")
        (entry,) = result["ui"]["images"]
        return str(entry["filename"])

    with ThreadPoolExecutor(max_workers=32) as pool:
        names = list(pool.map(save, range(100)))

    assert len(set(names)) == 100
    files = sorted(os.listdir(folders.output / "same"))
    assert files == sorted(names)
    assert files[0] == "prefix_00001_.png" and files[-1] == "prefix_00100_.png"
    reds = set()
    for name in files:
        with Image.open(folders.output / "same" / name) as png:
            reds.add(int(np.asarray(png)[0, 0, 0]))
    # Every call's image survived: none was overwritten by another.
    assert reds == set(range(100))


def test_preview_image_writes_temp_files_with_random_prefix(folders: Folders) -> None:
    node = PreviewImage()
    first = node.save_images(_image(batch=2))["ui"]["images"]
    second = node.save_images(_image())["ui"]["images"]
    names = [i["filename"] for i in first + second]
    pattern = re.compile(r"ComfyUI_temp_([a-z]{5})_(\d{5})_\.png")
    matches = [pattern.fullmatch(n) for n in names]
    assert all(matches)
    assert len({m.group(1) for m in matches if m}) == 1
    assert [m.group(2) for m in matches if m] == ["00001", "00002", "00003"]
    assert {(i["subfolder"], i["type"]) for i in first + second} == {("", "temp")}
    assert sorted(os.listdir(folders.temp)) == sorted(names)
    assert not os.listdir(folders.output)
    others = {PreviewImage().prefix_append for _ in range(5)}
    assert len(others) > 1


def _write_rgba(path: os.PathLike[str] | str) -> np.ndarray:
    """A 3x2 RGBA PNG with a known alpha ramp; returns its uint8 pixels."""
    pixels = np.zeros((2, 3, 4), dtype=np.uint8)
    pixels[..., 0] = 200
    pixels[..., 3] = [[0, 51, 255], [102, 204, 255]]
    Image.fromarray(pixels).save(path)
    return pixels


def test_load_image_round_trip_with_alpha_mask(folders: Folders) -> None:
    pixels = _write_rgba(folders.input / "alpha.png")
    image, mask = LoadImage().load_image("alpha.png")
    assert image.shape == (1, 2, 3, 3) and image.dtype == np.float32
    np.testing.assert_allclose(image[0, ..., 0], 200 / 255, rtol=1e-6)
    assert mask.shape == (1, 2, 3)
    np.testing.assert_allclose(mask[0], 1.0 - pixels[..., 3] / 255, atol=1e-6)


def test_load_image_from_subfolder_and_annotated_folders(folders: Folders) -> None:
    (folders.input / "sub").mkdir()
    _write_rgba(folders.input / "sub" / "x.png")
    assert LoadImage().load_image("sub/x.png")[0].shape == (1, 2, 3, 3)
    SaveImage().save_images(_image(color=0x00FF00, size=5), "saved")
    image, mask = LoadImage().load_image("saved_00001_.png [output]")
    assert image.shape == (1, 5, 5, 3)
    np.testing.assert_allclose(image[0, 0, 0], [0.0, 1.0, 0.0])
    assert mask.shape == (1, 5, 5) and not mask.any()
    _write_rgba(folders.temp / "t.png")
    assert LoadImage().load_image("t.png [temp]")[0].shape == (1, 2, 3, 3)


def test_load_image_reads_every_frame_of_an_animation(folders: Folders) -> None:
    frames = [Image.new("RGB", (4, 3), (v, v, v)) for v in (0, 128, 255)]
    frames[0].save(folders.input / "anim.gif", save_all=True, append_images=frames[1:])
    image, mask = LoadImage().load_image("anim.gif")
    assert image.shape == (3, 3, 4, 3)
    np.testing.assert_allclose(image[:, 0, 0, 0], [0.0, 128 / 255, 1.0], atol=1e-6)
    assert mask.shape == (3, 3, 4)


def test_load_image_palette_transparency_becomes_mask(folders: Folders) -> None:
    palette = Image.new("P", (2, 1))
    palette.putpalette([0, 0, 0, 255, 255, 255])
    palette.putpixel((1, 0), 1)
    palette.save(folders.input / "p.png", transparency=0)
    _, mask = LoadImage().load_image("p.png")
    np.testing.assert_allclose(mask[0], [[1.0, 0.0]])


def test_load_image_validation(folders: Folders) -> None:
    _write_rgba(folders.input / "ok.png")
    _write_rgba(folders.output / "out.png")
    _write_rgba(folders.output.parent / "outside.png")
    assert LoadImage.VALIDATE_INPUTS("ok.png") is True
    assert LoadImage.VALIDATE_INPUTS("out.png [output]") is True
    assert LoadImage.VALIDATE_INPUTS("missing.png") == "Invalid image file: missing.png"
    assert LoadImage.VALIDATE_INPUTS("out.png") == "Invalid image file: out.png"
    assert LoadImage.VALIDATE_INPUTS("../outside.png") == "Invalid image file: ../outside.png"
    with pytest.raises(ValueError, match="outside the input folder"):
        LoadImage().load_image("../outside.png")


def test_load_image_is_changed_is_the_file_hash(folders: Folders) -> None:
    path = folders.input / "h.png"
    _write_rgba(path)
    first = LoadImage.IS_CHANGED("h.png")
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    Image.new("RGB", (1, 1)).save(path)
    assert LoadImage.IS_CHANGED("h.png") != first


def test_save_image_truncates_to_8_bit_as_comfyui_does(folders: Folders) -> None:
    # 0.25 * 255 = 63.75 and 0.999 * 255 = 254.745: ComfyUI's uint8 cast truncates to 63 and 254.
    levels = np.array([0.0, 0.25, 0.5, 0.999, 1.5, -0.2], dtype=np.float32)
    image = np.broadcast_to(levels[None, None, :, None], (1, 1, 6, 3)).copy()
    SaveImage().save_images(image, "levels")
    with Image.open(folders.output / "levels_00001_.png") as png:
        pixels = np.asarray(png.convert("RGB"))[0, :, 0]
    expected = np.clip(255.0 * levels, 0, 255).astype(np.uint8)
    assert pixels.tolist() == expected.tolist() == [0, 63, 127, 254, 255, 0]
