"""GET /view: folders, previews, channels, and paths that must not leave the folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.server.fileserver import open_image, serve


def _rgba(path: Path, size: tuple[int, int] = (16, 8)) -> None:
    image = Image.new("RGBA", size, (10, 20, 30, 255))
    image.putpixel((0, 0), (200, 100, 50, 0))
    image.putpixel((1, 0), (200, 100, 50, 128))
    image.save(path)


async def test_view_plain_file_uses_its_mime_type(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.input / "pic.png")
        response = await served.client.get("/view?filename=pic.png&type=input")
        assert response.status == 200
        assert response.headers["Content-Type"] == "image/png"
        assert response.headers["Content-Disposition"] == 'filename="pic.png"'
        assert await response.read() == (served.folders.input / "pic.png").read_bytes()


async def test_view_subfolder_and_annotations(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        (served.folders.temp / "sub").mkdir()
        _rgba(served.folders.temp / "sub" / "t.png")
        ok = await served.client.get("/view?filename=t.png&type=temp&subfolder=sub")
        assert ok.status == 200
        # The annotation names the folder and wins over `type`.
        _rgba(served.folders.input / "i.png")
        annotated = await served.client.get("/view", params={"filename": "i.png [input]"})
        assert annotated.status == 200
        missing = await served.client.get("/view?filename=t.png&type=temp")
        assert missing.status == 404


@pytest.mark.parametrize(
    ("preview", "content_type", "mode"),
    [
        ("webp;50", "image/webp", "RGBA"),
        ("jpeg;90", "image/jpeg", "RGB"),
        ("jpeg", "image/jpeg", "RGB"),
        ("gif;10", "image/webp", "RGBA"),  # unknown formats fall back to WEBP
    ],
)
async def test_view_preview_formats(
    tmp_path: Path, preview: str, content_type: str, mode: str
) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / "a.png")
        response = await served.client.get(
            "/view", params={"filename": "a.png", "preview": preview}
        )
        assert response.status == 200
        assert response.headers["Content-Type"] == content_type
        assert response.headers["Content-Disposition"] == 'filename="a.png"'
        image = open_image(await response.read())
        assert (image.size, image.mode) == ((16, 8), mode)


async def test_view_preview_rgb_channel_drops_alpha(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / "a.png")
        params = {"filename": "a.png", "preview": "webp;90", "channel": "rgb"}
        response = await served.client.get("/view", params=params)
        image = open_image(await response.read())
        assert (response.content_type, image.mode) == ("image/webp", "RGB")


async def test_view_channels(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / "a.png")
        rgb = await served.client.get("/view?filename=a.png&channel=rgb")
        assert rgb.headers["Content-Type"] == "image/png"
        rgb_image = open_image(await rgb.read())
        assert rgb_image.mode == "RGB"
        assert rgb_image.getpixel((0, 0)) == (200, 100, 50)  # colour kept, not composited

        alpha = await served.client.get("/view?filename=a.png&channel=a")
        alpha_image = open_image(await alpha.read())
        assert alpha_image.mode == "RGBA"
        assert alpha_image.getpixel((0, 0)) == (0, 0, 0, 0)
        assert alpha_image.getpixel((1, 0)) == (0, 0, 0, 128)
        assert alpha_image.getpixel((5, 5)) == (0, 0, 0, 255)


async def test_view_alpha_of_opaque_image_is_full(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        Image.new("RGB", (4, 4), (1, 2, 3)).save(served.folders.output / "rgb.png")
        response = await served.client.get("/view?filename=rgb.png&channel=a")
        assert open_image(await response.read()).getchannel("A").getextrema() == (255, 255)


async def test_view_html_is_sent_as_download(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        (served.folders.output / "x.html").write_text("<script>alert(1)</script>")
        response = await served.client.get("/view?filename=x.html")
        assert response.headers["Content-Type"] == "application/octet-stream"


async def test_view_preview_of_non_image_is_400(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        (served.folders.output / "notes.txt").write_text("hello")
        response = await served.client.get("/view?filename=notes.txt&preview=webp")
        assert response.status == 400
        assert response.headers.get("Content-Type") is None


async def test_view_under_api_prefix(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / "a.png")
        response = await served.client.get("/api/view?filename=a.png")
        assert response.status == 200


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("filename=%2e%2e%2fsecret.png", 400),
        ("filename=..%2Fsecret.png", 400),
        ("filename=%2Fetc%2Fpasswd", 400),
        ("filename=a.png%00.txt", 400),
        ("filename=secret.png&subfolder=%2e%2e", 403),
        ("filename=secret.png&subfolder=..%2F..", 403),
        ("filename=passwd&subfolder=%2Fetc", 403),
        ("filename=secret.png&subfolder=sub%2F..%2F..", 403),
        ("filename=secret.png&type=", 400),
        ("filename=secret.png [bogus]", 404),  # not an annotation: a plain, missing name
    ],
)
async def test_view_path_escapes_are_refused(tmp_path: Path, query: str, status: int) -> None:
    (tmp_path / "secret.png").write_bytes(b"top secret")
    async with serve(tmp_path / "data") as served:
        response = await served.client.get(f"/view?{query}")
        assert response.status == status
        assert await response.read() == b""


async def test_view_symlinks_leading_outside_are_403(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _rgba(outside / "secret.png")
    async with serve(tmp_path / "data") as served:
        os.symlink(outside / "secret.png", served.folders.output / "link.png")
        os.symlink(outside, served.folders.output / "linkdir")
        file_link = await served.client.get("/view?filename=link.png")
        assert file_link.status == 403
        dir_link = await served.client.get("/view?filename=secret.png&subfolder=linkdir")
        assert dir_link.status == 403
        for channel in ("rgb", "a"):
            response = await served.client.get(f"/view?filename=link.png&channel={channel}")
            assert response.status == 403


async def test_view_symlink_inside_the_folder_is_served(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / "real.png")
        os.symlink(served.folders.output / "real.png", served.folders.output / "alias.png")
        response = await served.client.get("/view?filename=alias.png")
        assert response.status == 200
        assert response.headers["Content-Disposition"] == 'filename="alias.png"'


async def test_view_quotes_in_names_stay_inside_the_header(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        _rgba(served.folders.output / 'we"ird.png')
        response = await served.client.get("/view", params={"filename": 'we"ird.png'})
        assert response.status == 200
        assert response.headers["Content-Disposition"] == 'filename="we\\"ird.png"'
