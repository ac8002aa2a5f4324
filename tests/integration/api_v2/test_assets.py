"""Comfy API v2 assets through comfy-sdk and raw HTTP: uploads de-duplicated by blake3,
from-hash, by-hash, get, ranged content, delete, and assets into LoadImage."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
import blake3
import pytest
from comfy_sdk import Workflow
from comfy_sdk.exceptions import ComfyError
from PIL import Image

from tests.integration.api_v2.conftest import ALICE, BOB, Served

V2 = "/api/v2"


def png(color: tuple[int, int, int], size: tuple[int, int] = (4, 3)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def near(pixel: Any, wanted: tuple[int, int, int]) -> bool:
    """Equal within the rounding of float images (one step per channel)."""
    return all(abs(a - b) <= 1 for a, b in zip(pixel, wanted, strict=True))


def inverting(image: object) -> dict[str, object]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inv"}},
    }


def blobs(served: Served, tenant: str = "default") -> list[Path]:
    folder = Path(served.gateway.tenants.of(tenant).input) / "assets"
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


async def test_an_uploaded_asset_feeds_load_image(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = png((10, 200, 30))
    async with served.client(monkeypatch) as comfy:
        asset = comfy.assets.from_bytes(data, filename="green.png")
        job = await comfy.run(Workflow(inverting(asset)), timeout=30)
        assert (
            asset.created_new is True and asset.hash == "blake3:" + blake3.blake3(data).hexdigest()
        )
        [output] = job.outputs
        with Image.open(io.BytesIO(await output.to_bytes())) as picture:
            assert near(picture.convert("RGB").getpixel((0, 0)), (245, 55, 225))
        # The same bytes again: the SDK finds them by hash and mints a new asset over them.
        again = comfy.assets.from_bytes(data, filename="again.png")
        await again.commit()
        assert again.id != asset.id and again.created_new is False
        assert len(blobs(served)) == 1
        assert asset.id is not None
        fetched = await comfy.assets.get(asset.id)
        assert fetched.id == asset.id
    status, _, record = await served.call("GET", f"{V2}/assets/{asset.id}")
    assert status == 200 and record["size_bytes"] == len(data)
    assert (record["file_path"], record["content_type"]) == ("green.png", "image/png")
    async with served.session.get(
        served.url + f"{V2}/assets/{asset.id}/content", headers={"Range": "bytes=1-3"}
    ) as part:
        assert part.status == 206 and await part.read() == data[1:4]
    # An output used as an input.
    job2 = None
    async with served.client(monkeypatch) as comfy:
        ref = {"__type": "core/ASSET", "info": {"id": output.id}}
        job2 = await comfy.run(Workflow(inverting(ref)), timeout=30)
        with Image.open(io.BytesIO(await job2.outputs[0].to_bytes())) as picture:
            assert near(picture.convert("RGB").getpixel((0, 0)), (10, 200, 30))


async def test_upload_checks_its_hash_and_delete_keeps_shared_bytes(served: Served) -> None:
    data = png((1, 2, 3))
    digest = "blake3:" + blake3.blake3(data).hexdigest()

    def form(expected: str | None = None) -> aiohttp.FormData:
        fields = aiohttp.FormData()
        fields.add_field("content_type", "image/png")
        fields.add_field("file_path", "a.png")
        if expected:
            fields.add_field("expected_hash", expected)
        fields.add_field("file", data, filename="a.png", content_type="image/png")
        return fields

    status, _, answer = await served.call("POST", f"{V2}/assets", data=form("blake3:" + "0" * 64))
    assert status == 409 and answer["error"]["code"] == "hash_mismatch"
    assert blobs(served) == []
    status, _, first = await served.call("POST", f"{V2}/assets", data=form(digest))
    assert status == 201 and first["hash"] == digest and first["created_new"] is True
    status, _, second = await served.call("POST", f"{V2}/assets", data=form())
    assert status == 201 and second["created_new"] is False and second["id"] != first["id"]
    assert (await served.call("HEAD", f"{V2}/assets/by-hash/{digest}"))[0] == 200
    assert (await served.call("DELETE", f"{V2}/assets/{first['id']}"))[0] == 204
    assert (await served.call("GET", f"{V2}/assets/{first['id']}"))[0] == 404
    assert len(blobs(served)) == 1  # the second asset still names the bytes
    assert (await served.call("DELETE", f"{V2}/assets/{second['id']}"))[0] == 204
    assert blobs(served) == []
    assert (await served.call("HEAD", f"{V2}/assets/by-hash/{digest}"))[0] == 404
    status, _, answer = await served.call("POST", f"{V2}/assets/from-hash", json={"hash": digest})
    assert status == 404 and answer["error"]["code"] == "blob_not_found"
    bodies: list[Any] = [{}, {"hash": "md5:x"}, []]
    for body in bodies:
        status, _, answer = await served.call("POST", f"{V2}/assets/from-hash", json=body)
        assert status == 400 and answer["error"]["code"] == "invalid_request"
    status, _, answer = await served.call("POST", f"{V2}/assets", data=b"x")
    assert status == 400 and answer["error"]["code"] == "invalid_request"


async def test_assets_are_the_tenants_own(tenants: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    data = png((9, 9, 9))
    async with tenants.client(monkeypatch, ALICE) as alice:
        asset = alice.assets.from_bytes(data, filename="mine.png")
        await asset.commit()
    digest = asset.hash
    assert (await tenants.call("HEAD", f"{V2}/assets/by-hash/{digest}", token=BOB))[0] == 404
    assert (await tenants.call("GET", f"{V2}/assets/{asset.id}", token=BOB))[0] == 404
    assert (await tenants.call("GET", f"{V2}/assets/{asset.id}/content", token=BOB))[0] == 404
    assert (await tenants.call("DELETE", f"{V2}/assets/{asset.id}", token=BOB))[0] == 404
    async with tenants.client(monkeypatch, BOB) as bob:
        ref = {"__type": "core/ASSET", "info": {"id": asset.id}}
        with pytest.raises(ComfyError) as refused:
            await bob.submit(Workflow(inverting(ref)))
        assert refused.value.code == "missing_asset"
        # Bob's own upload of the same bytes is his, in his own folder.
        mine = bob.assets.from_bytes(data, filename="same.png")
        await mine.commit()
        assert mine.created_new is True and mine.id != asset.id
    assert (await tenants.call("GET", f"{V2}/assets/{asset.id}", token=ALICE))[0] == 200


async def test_a_malformed_form_is_400_not_a_server_error(served: Served) -> None:
    boundary = "b0undary"
    body = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="bad\x13name"\r\n\r\nx\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    status, _, answer = await served.call("POST", f"{V2}/assets", data=body, headers=headers)
    assert status == 400 and answer["error"]["code"] == "invalid_request"
    form = aiohttp.FormData()
    form.add_field("content_type", "image/png")
    form.add_field("file_path", "a\x01.png")
    form.add_field("file", b"abc", filename="a.png", content_type="image/png")
    status, _, answer = await served.call("POST", f"{V2}/assets", data=form)
    assert status == 400 and answer["error"]["code"] == "invalid_request"
    folder = Path(served.gateway.tenants.of("default").input) / "assets"
    assert list(folder.iterdir()) == []  # nothing kept of a refused upload, no spool left


async def test_an_endless_form_is_cut_off(served: Served) -> None:
    form = aiohttp.FormData()
    for _ in range(1100):  # a MiB of tags, past what an upload may carry besides its file
        form.add_field("tags", "t" * 1000)
    form.add_field("content_type", "image/png")
    form.add_field("file_path", "a.png")
    form.add_field("file", b"abc", filename="a.png", content_type="image/png")
    status, _, answer = await served.call("POST", f"{V2}/assets", data=form)
    assert status == 413 and answer["error"]["code"] == "too_large"
