"""Uploads are pushed to the backend that runs the prompt; its outputs are copied back."""

from __future__ import annotations

import hashlib
import io
import shutil

import aiohttp
import numpy as np
from PIL import Image

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import backend_history


def picture() -> bytes:
    pixels = np.random.default_rng(7).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


async def test_upload_pushed_and_output_copied(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1)
    backend = fleet.backends["s0"]
    base = fleet.gateway.url
    data = picture()
    async with aiohttp.ClientSession() as session:
        form = aiohttp.FormData()
        form.add_field("image", data, filename="fleet_in.png", content_type="image/png")
        form.add_field("subfolder", "fleetsub")
        async with session.post(f"{base}/upload/image", data=form) as response:
            assert response.status == 200, await response.text()
            uploaded = await response.json()
        assert uploaded == {"name": "fleet_in.png", "subfolder": "fleetsub", "type": "input"}
        image = "fleetsub/fleet_in.png"
        assert not (backend.data_dir / "input" / image).exists()

        prompt = {
            "1": {"class_type": "LoadImage", "inputs": {"image": image}},
            "2": {
                "class_type": "SaveImage",
                "inputs": {"images": ["1", 0], "filename_prefix": "fleetio/copied"},
            },
        }
        prompt_id = fleet.submit(prompt)
        job = fleet.wait_job(prompt_id, "completed", "failed")
        assert (job["status"], job["lane"]) == ("completed", "backend:s0"), job
        # Pushed before the prompt ran there, byte for byte, to a place named by its
        # content in the `default` tenant's space.
        digest = hashlib.sha256(data).hexdigest()[:32]
        pushed = backend.data_dir / "input" / "_tenants" / "default" / digest / "fleet_in.png"
        assert pushed.read_bytes() == data

        (saved,) = fleet.history()[prompt_id]["outputs"]["2"]["images"]
        assert saved["type"] == "output" and saved["subfolder"] == "fleetio"
        there = backend_history(backend, prompt_id)
        assert there is not None
        assert there["outputs"]["2"]["images"][0]["filename"] == saved["filename"]

        params = {k: saved[k] for k in ("filename", "subfolder", "type")}
        shutil.rmtree(backend.data_dir / "output")
        try:
            async with session.get(f"{backend.url}/view", params=params) as response:
                assert response.status == 404  # the backend's copy is gone
            async with session.get(f"{base}/view", params=params) as response:
                assert response.status == 200
                served = await response.read()
        finally:
            (backend.data_dir / "output").mkdir(exist_ok=True)
        with Image.open(io.BytesIO(served)) as got, Image.open(io.BytesIO(data)) as sent:
            assert got.size == (16, 12)
            assert np.array_equal(np.asarray(got.convert("RGB")), np.asarray(sent))


async def test_reference_mode_serves_outputs_from_the_backend(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, gateway_args=("--output-mode", "reference"))
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 24, "height": 10, "batch_size": 1, "color": 0x00FF00},
        },
        "2": {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": "ref/x"},
        },
    }
    prompt_id = fleet.submit(prompt)
    job = fleet.wait_job(prompt_id, "completed", "failed")
    assert job["status"] == "completed", job
    (saved,) = fleet.history()[prompt_id]["outputs"]["2"]["images"]
    assert saved["subfolder"] == "@s0/ref"
    # Not copied: the gateway's own output folder has no such file.
    assert not list((fleet.gateway.data_dir / "output").rglob(saved["filename"]))
    params = {k: saved[k] for k in ("filename", "subfolder", "type")}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fleet.gateway.url}/view", params=params) as response:
            assert response.status == 200
            assert response.content_type == "image/png"
            body = await response.read()
        missing = {**params, "filename": "nope.png"}
        async with session.get(f"{fleet.gateway.url}/view", params=missing) as response:
            assert response.status == 404
        unknown = {**params, "subfolder": "@nobody/ref"}
        async with session.get(f"{fleet.gateway.url}/view", params=unknown) as response:
            assert response.status == 404
    with Image.open(io.BytesIO(body)) as got:
        assert got.size == (24, 10)
        assert got.convert("RGB").getpixel((3, 3)) == (0, 255, 0)
