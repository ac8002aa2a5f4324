"""POST /upload/image and /upload/mask: name clashes, concurrency, limits and path escapes."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

from comfyfleet.server.files.view_upload import MAX_SUBFOLDER_DEPTH
from tests.integration.server.fileserver import (
    Fields,
    Served,
    multipart,
    open_image,
    png_bytes,
    serve,
)

RED = png_bytes((255, 0, 0))
BLUE = png_bytes((0, 0, 255))


async def _upload(
    served: Served,
    fields: Fields,
    path: str = "/upload/image",
) -> tuple[int, object]:
    body, content_type = multipart(fields)
    response = await served.client.post(
        path, data=io.BytesIO(body), headers={"Content-Type": content_type}
    )
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return response.status, await response.json()
    assert await response.read() == b""
    return response.status, None


async def test_upload_defaults_to_input(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        status, reply = await _upload(served, [("image", ("a.png", RED))])
        assert (status, reply) == (200, {"name": "a.png", "subfolder": "", "type": "input"})
        assert (served.folders.input / "a.png").read_bytes() == RED


async def test_upload_numbering_continues_and_reuses_identical_content(tmp_path: Path) -> None:
    green = png_bytes((0, 255, 0))
    async with serve(tmp_path) as served:
        names = []
        for data in (RED, BLUE, green, BLUE, RED):
            _, reply = await _upload(served, [("image", ("a.png", data))])
            assert isinstance(reply, dict)
            names.append(reply["name"])
        assert names == ["a.png", "a (1).png", "a (2).png", "a (1).png", "a.png"]
        assert sorted(os.listdir(served.folders.input)) == ["a (1).png", "a (2).png", "a.png"]


async def test_upload_to_output_subfolder(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        fields: Fields = [("type", "output"), ("subfolder", "x/y"), ("image", ("a.png", RED))]
        status, reply = await _upload(served, fields)
        assert (status, reply) == (200, {"name": "a.png", "subfolder": "x/y", "type": "output"})
        assert (served.folders.output / "x" / "y" / "a.png").read_bytes() == RED


async def test_upload_overwrite_accepts_1(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        await _upload(served, [("image", ("a.png", RED))])
        status, reply = await _upload(served, [("overwrite", "1"), ("image", ("a.png", BLUE))])
        assert (status, reply) == (200, {"name": "a.png", "subfolder": "", "type": "input"})
        assert (served.folders.input / "a.png").read_bytes() == BLUE
        assert os.listdir(served.folders.input) == ["a.png"]  # no staging file left behind


async def test_upload_under_api_prefix(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        status, _ = await _upload(served, [("image", ("a.png", RED))], "/api/upload/image")
        assert status == 200


async def test_concurrent_same_name_uploads_never_overwrite(tmp_path: Path) -> None:
    contents = [png_bytes((i * 20, 0, 0)) for i in range(10)]
    async with serve(tmp_path) as served:
        replies = await asyncio.gather(
            *(_upload(served, [("image", ("same.png", data))]) for data in contents)
        )
        names = [reply["name"] for _, reply in replies if isinstance(reply, dict)]
        assert len(set(names)) == len(contents)
        for name, data in zip(names, contents, strict=True):
            assert (served.folders.input / name).read_bytes() == data
        assert len(os.listdir(served.folders.input)) == len(contents)


@pytest.mark.parametrize(
    "fields",
    [
        [("image", ("../escape.png", RED))],
        [("image", ("sub/../../escape.png", RED))],
        [("image", ("..", RED))],
        [("image", ("", RED))],
        [("subfolder", "../.."), ("image", ("escape.png", RED))],
        [("subfolder", "/tmp"), ("image", ("escape.png", RED))],
        [("subfolder", "a/../../x"), ("image", ("escape.png", RED))],
        [("subfolder", "a/../b"), ("image", ("inside.png", RED))],  # `..` at all: refused
        [("subfolder", "/".join(["a"] * 1000)), ("image", ("escape.png", RED))],
        [
            ("subfolder", "/".join(["a"] * (MAX_SUBFOLDER_DEPTH + 1))),
            ("image", ("escape.png", RED)),
        ],
        [("subfolder", "a\ud800"), ("image", ("escape.png", RED))],
        [("image", ("escape\ud800.png", RED))],  # bytes that are not UTF-8
        [("type", "bogus"), ("image", ("escape.png", RED))],
        [("type", "input")],
        [("image", "not a file")],
    ],
)
async def test_upload_bad_requests_are_400(tmp_path: Path, fields: Fields) -> None:
    async with serve(tmp_path / "data") as served:
        status, _ = await _upload(served, fields)
        assert status == 400
    assert not list(tmp_path.rglob("escape.png"))


async def test_upload_subfolder_at_the_depth_cap(tmp_path: Path) -> None:
    subfolder = "/".join(["a"] * MAX_SUBFOLDER_DEPTH)
    async with serve(tmp_path) as served:
        status, reply = await _upload(served, [("subfolder", subfolder), ("image", ("a.png", RED))])
        assert (status, reply) == (200, {"name": "a.png", "subfolder": subfolder, "type": "input"})


@pytest.mark.parametrize(
    ("path", "name", "text"),
    [
        ("/upload/image", "subfolder", "x\\ud800"),
        ("/upload/mask", "original_ref", '{"filename": "orig\\ud800.png"}'),
    ],
)
async def test_upload_text_field_decoded_to_a_lone_surrogate_is_400(
    tmp_path: Path, path: str, name: str, text: str
) -> None:
    """A part's charset decides how its text decodes: unicode_escape makes `\\ud800` a lone
    surrogate, which no file name can hold."""
    boundary = "b"
    body = (
        (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{name}"\r\n'
            "Content-Type: text/plain; charset=unicode_escape\r\n\r\n"
            f"{text}\r\n"
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="image"; filename="escape.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + RED
        + f"\r\n--{boundary}--\r\n".encode()
    )
    async with serve(tmp_path / "data") as served:
        response = await served.client.post(
            path, data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        assert response.status == 400
    assert not list(tmp_path.rglob("escape.png"))


async def test_upload_not_multipart_is_400(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        response = await served.client.post("/upload/image", data=b"x")
        assert response.status == 400
        response = await served.client.post(
            "/upload/image", data=b"garbage", headers={"Content-Type": "multipart/form-data"}
        )
        assert response.status == 400


async def test_upload_into_symlinked_subfolder_leading_outside_is_400(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with serve(tmp_path / "data") as served:
        os.symlink(outside, served.folders.input / "link")
        fields: Fields = [("subfolder", "link"), ("image", ("a.png", RED))]
        status, _ = await _upload(served, fields)
        assert status == 400
    assert os.listdir(outside) == []


async def test_upload_never_writes_through_a_symlinked_name(tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(RED)
    async with serve(tmp_path / "data") as served:
        os.symlink(outside, served.folders.input / "a.png")
        status, reply = await _upload(served, [("image", ("a.png", RED))])
        # Same bytes behind the link, but a link is never taken as the uploaded file.
        assert (status, reply) == (200, {"name": "a (1).png", "subfolder": "", "type": "input"})
    assert outside.read_bytes() == RED


async def test_upload_over_the_limit_is_413(tmp_path: Path) -> None:
    big = os.urandom(4096)
    async with serve(tmp_path, max_upload_bytes=1024) as served:
        status, _ = await _upload(served, [("image", ("big.png", big))])
        assert status == 413
        assert os.listdir(served.folders.input) == []


async def test_upload_over_the_limit_without_content_length_is_413(tmp_path: Path) -> None:
    body, content_type = multipart([("image", ("big.png", os.urandom(64 * 1024)))])

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to check up front
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    async with serve(tmp_path, max_upload_bytes=8 * 1024) as served:
        response = await served.client.post(
            "/upload/image", data=chunks(), headers={"Content-Type": content_type}
        )
        assert response.status == 413
        assert os.listdir(served.folders.input) == []


async def test_upload_large_file_streams_to_disk(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # several flushes and a spool rollover
    async with serve(tmp_path) as served:
        status, reply = await _upload(served, [("image", ("big.bin", data))])
        assert (status, reply) == (200, {"name": "big.bin", "subfolder": "", "type": "input"})
        assert (served.folders.input / "big.bin").read_bytes() == data
        status, reply = await _upload(served, [("image", ("big.bin", data))])
        assert reply == {"name": "big.bin", "subfolder": "", "type": "input"}


# ---------------------------------------------------------------- /upload/mask


def _original(path: Path) -> None:
    info = PngImagePlugin.PngInfo()
    info.add_text("prompt", '{"1": {}}')
    Image.new("RGB", (8, 8), (10, 20, 30)).save(path, pnginfo=info)


def _mask_png() -> bytes:
    mask = Image.new("RGBA", (8, 8), (0, 0, 0, 255))
    mask.putpixel((2, 3), (0, 0, 0, 0))
    buf = io.BytesIO()
    mask.save(buf, format="PNG")
    return buf.getvalue()


async def test_upload_mask_applies_alpha_to_the_original(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        (served.folders.output / "sub").mkdir()
        _original(served.folders.output / "sub" / "orig.png")
        ref = json.dumps({"filename": "orig.png", "subfolder": "sub", "type": "output"})
        fields: Fields = [
            ("image", ("clipspace-mask.png", _mask_png())),
            ("original_ref", ref),
            ("type", "input"),
            ("subfolder", "clipspace"),
        ]
        status, reply = await _upload(served, fields, "/upload/mask")
        assert (status, reply) == (
            200,
            {"name": "clipspace-mask.png", "subfolder": "clipspace", "type": "input"},
        )
        stored = open_image(
            (served.folders.input / "clipspace" / "clipspace-mask.png").read_bytes()
        )
        assert stored.mode == "RGBA"
        assert stored.getpixel((2, 3)) == (10, 20, 30, 0)
        assert stored.getpixel((0, 0)) == (10, 20, 30, 255)
        assert getattr(stored, "text", {}).get("prompt") == '{"1": {}}'


@pytest.mark.parametrize(
    ("ref", "status"),
    [
        (None, 400),
        ("not json", 400),
        (json.dumps({"subfolder": ""}), 400),
        (json.dumps({"filename": "../orig.png"}), 400),
        (json.dumps({"filename": "orig.png", "type": "bogus"}), 400),
        (json.dumps({"filename": "orig.png", "subfolder": "../.."}), 403),
        (json.dumps({"filename": "missing.png"}), 404),
        ('{"filename": "orig.png", "subfolder": "\\ud800"}', 400),
        ('{"filename": "orig\\udfff.png"}', 400),
        ("[" * 30_000 + "]" * 30_000, 400),  # past the JSON parser's recursion
    ],
)
async def test_upload_mask_bad_original_ref(tmp_path: Path, ref: str | None, status: int) -> None:
    async with serve(tmp_path) as served:
        _original(served.folders.output / "orig.png")
        fields: Fields = [("image", ("m.png", _mask_png()))]
        if ref is not None:
            fields.append(("original_ref", ref))
        got, _ = await _upload(served, fields, "/upload/mask")
        assert got == status
        assert os.listdir(served.folders.input) == []


async def test_upload_mask_of_another_size_is_400(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _original(served.folders.output / "orig.png")
        fields: Fields = [
            ("image", ("m.png", png_bytes((0, 0, 0, 0), (4, 4), "RGBA"))),
            ("original_ref", json.dumps({"filename": "orig.png"})),
        ]
        status, _ = await _upload(served, fields, "/upload/mask")
        assert status == 400
