"""Uploads are pushed to the backend that runs the prompt; its outputs are copied back."""

from __future__ import annotations

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
        # Pushed before the prompt ran there, byte for byte.
        assert (backend.data_dir / "input" / image).read_bytes() == data

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
