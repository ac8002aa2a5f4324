"""Scenario 10 of the ComfyUI 0.3.64 recording, replayed against the file and system routes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
from PIL import Image

from tests.helpers import load_scenario
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
CONTENTS = {"red 8x8 PNG": RED, "blue 8x8 PNG": BLUE}
# Endpoints outside these routes (/ws, /system_stats values) are checked elsewhere.
REPLAYED = ("/view", "/upload/", "/features", "/models", "/embeddings", "/object_info/", "/prompt")


def _steps() -> list[dict[str, Any]]:
    steps = load_scenario("10-misc-endpoints")["steps"]
    return [
        step
        for step in steps
        if step["kind"] == "http" and step["path"].removeprefix("/api").startswith(REPLAYED)
    ]


def _form(description: dict[str, Any]) -> tuple[bytes, str]:
    fields: Fields = []
    for name, value in description.items():
        if isinstance(value, dict):
            fields.append((name, (value["filename"], CONTENTS[value["content"]])))
        else:
            fields.append((name, value))
    return multipart(fields)


def _seed(served: Served) -> None:
    # The SaveImage output of scenario 01: EmptyImage(64x64, black) inverted.
    Image.new("RGB", (64, 64), (255, 255, 255)).save(
        served.folders.output / "ref_success_00001_.png"
    )


async def _send(served: Served, step: dict[str, Any]) -> aiohttp.ClientResponse:
    headers = dict(step.get("request_headers", {}))
    if headers.get("Origin") == "http://127.0.0.1:8190":  # the recorded server's own port
        headers["Origin"] = f"http://127.0.0.1:{served.port}"
    kwargs: dict[str, Any] = {"headers": headers}
    if "request_json" in step:
        kwargs["json"] = step["request_json"]
    if "request_multipart" in step:
        kwargs["data"], headers["Content-Type"] = _form(step["request_multipart"])
    return await served.client.request(step["method"], step["path"], **kwargs)


async def _check(response: aiohttp.ClientResponse, step: dict[str, Any]) -> None:
    where = f"{step['method']} {step['path']}"
    assert response.status == step["status"], where
    assert response.headers.get("Content-Type") == step["response_content_type"], where
    if "response_json" in step:
        assert await response.json() == step["response_json"], where
    elif "response_text" in step:
        assert await response.text() == step["response_text"], where
    else:
        expected = step["response_binary"]
        body = await response.read()
        assert body.startswith(bytes.fromhex(expected["magic_hex"][:8])), where
        image = open_image(body)
        shape = expected["image"]
        assert (image.format, image.size, image.mode) == (
            shape["format"],
            (shape["width"], shape["height"]),
            shape["mode"],
        ), where
        for name, value in step["response_headers"].items():
            assert response.headers[name] == value, where


async def test_replay_scenario_10(tmp_path: Path) -> None:
    steps = _steps()
    assert len(steps) >= 25  # the recording has not lost its /view and /upload steps
    async with serve(tmp_path) as served:
        _seed(served)
        for step in steps:
            async with await _send(served, step) as response:
                await _check(response, step)
        folders = served.folders
        assert (folders.input / "ref_upload.png").read_bytes() == BLUE  # overwrite=true
        assert (folders.input / "ref_upload (1).png").read_bytes() == BLUE
        assert (folders.temp / "ref_sub" / "ref_upload.png").read_bytes() == RED
        assert sorted(p.name for p in folders.input.iterdir()) == [
            "ref_upload (1).png",
            "ref_upload.png",
        ]
        assert not list(tmp_path.rglob("ref_upload_escape.png"))


async def test_recorded_webp_preview_is_smaller_than_png(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _seed(served)
        response = await served.client.get(
            "/view", params={"filename": "ref_success_00001_.png", "preview": "webp;50"}
        )
        body = await response.read()
        assert response.content_type == "image/webp"
        with Image.open(io.BytesIO(body)) as image:
            assert image.getpixel((10, 10)) == (255, 255, 255)
