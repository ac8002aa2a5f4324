"""The editor's workflow templates at `/templates/`, as ComfyUI 0.3.64 serves the
`comfyui-workflow-templates` package's folder: the index, its translations, every
template's workflow and thumbnails. Nothing outside that folder is ever served: hostile
names and links out of it are 404, never an error."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import comfyui_workflow_templates
import pytest
from yarl import URL

from tests.servers import start_in_process

PACKAGE = Path(comfyui_workflow_templates.__file__).parent
TEMPLATES = PACKAGE / "templates"


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[int, aiohttp.ClientSession]]:
    server, _gateway = await start_in_process(tmp_path / "data", local_slots=1)
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as session:
            assert server.port is not None
            yield server.port, session
    finally:
        await server.close()


async def _raw_status(port: int, path: str) -> int:
    """The status of a GET of `path` sent as it is (a client would remove `..`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = (await reader.readline()).decode()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


async def test_the_index_lists_the_packaged_templates_and_each_is_served(tmp_path: Path) -> None:
    async with served(tmp_path) as (_port, session):
        async with session.get("/templates/index.json") as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "application/json"
            assert answer.headers["Cache-Control"] == "no-cache"  # ComfyUI's, for index*.json
            body = await answer.read()
        assert body == (TEMPLATES / "index.json").read_bytes()
        index: list[dict[str, Any]] = json.loads(body)
        assert index[0]["title"] == "Getting Started"
        templates = [t for category in index for t in category["templates"]]
        assert {"default", "image2image"} <= {t["name"] for t in templates}
        assert len(templates) > 100
        for template in templates:
            # What the editor fetches: the workflow when a card is clicked, and the
            # card's thumbnails (two for a slider or a dissolve between them).
            name, subtype = template["name"], template["mediaSubtype"]
            async with session.get(f"/templates/{name}.json") as workflow:
                assert workflow.status == 200, name
                assert "nodes" in json.loads(await workflow.read()), name
            pair = template.get("thumbnailVariant") in ("compareSlider", "hoverDissolve")
            for number in ("1", "2") if pair else ("1",):
                async with session.get(f"/templates/{name}-{number}.{subtype}") as thumbnail:
                    assert thumbnail.status == 200, (name, number)
                    await thumbnail.read()
        async with session.get("/templates/default-1.webp") as thumbnail:
            assert thumbnail.headers["Content-Type"] == "image/webp"
            assert thumbnail.headers["Cache-Control"] == "public, max-age=86400"
            assert await thumbnail.read() == (TEMPLATES / "default-1.webp").read_bytes()


async def test_translations_and_names_that_need_encoding_are_served(tmp_path: Path) -> None:
    async with served(tmp_path) as (_port, session):
        for language in ("zh", "zh-TW", "ja", "ko", "fr", "es", "ru"):
            async with session.get(f"/templates/index.{language}.json") as translated:
                assert translated.status == 200, language
                assert translated.headers["Cache-Control"] == "no-cache"
                packaged = (TEMPLATES / f"index.{language}.json").read_bytes()
                assert await translated.read() == packaged
        async with session.get("/templates/index.schema.json") as schema:
            assert schema.status == 200
        # A file name with a space and brackets, as the package has one.
        async with session.get("/templates/video_wan2_2_14B_t2v%20(2).json") as spaced:
            assert spaced.status == 200
            assert await spaced.read() == (TEMPLATES / "video_wan2_2_14B_t2v (2).json").read_bytes()
        async with session.get("/templates/index.json", headers={"Range": "bytes=0-0"}) as part:
            assert part.status == 206
            assert await part.read() == b"["


HOSTILE = [
    "/templates/nope.json",  # missing
    "/templates/",  # the folder itself (ComfyUI: 403)
    "/templates",
    "/templates/%2E%2E/__init__.py",  # the package's own file, just outside the folder
    "/templates/..%2F__init__.py",
    "/templates/..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/templates/%2Fetc%2Fpasswd",  # absolute
    "/templates//etc/passwd",
    "/templates/..%5C__init__.py",  # a Windows separator
    "/templates/C:%5CWindows%5Cwin.ini",
    "/templates/index.json%00.png",  # NUL
    "/templates/%0Aindex.json",  # a control character
    "/templates/" + "x" * 300 + ".json",  # longer than a file name may be
    "/templates/%ZZ.json",  # not a valid escape
    "/api/templates/index.json",  # ComfyUI serves the folder without an /api twin
]


async def test_hostile_or_missing_names_are_404(tmp_path: Path) -> None:
    async with served(tmp_path) as (_port, session):
        for path in HOSTILE:
            async with session.get(URL(path, encoded=True)) as answer:
                assert answer.status == 404, path
                assert await answer.read() in (b"", b"404: Not Found"), path


async def test_dot_dot_sent_as_it_is_leads_nowhere_outside(tmp_path: Path) -> None:
    async with served(tmp_path) as (port, _session):
        assert await _raw_status(port, "/templates/../__init__.py") == 404
        assert await _raw_status(port, "/templates/../../../../../etc/passwd") == 404
        # `..` that comes back into the folder is the same file, as with ComfyUI.
        assert await _raw_status(port, "/templates/../templates/index.json") == 200


async def test_a_link_out_of_the_templates_folder_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A templates package whose folder holds links (installed in its place): a link to
    a file inside the folder is served, a link out of it is 404."""
    site = tmp_path / "site"
    folder = site / "comfyui_workflow_templates" / "templates"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    (folder / "index.json").write_text('[{"moduleName": "default", "templates": []}]')
    (folder / "same.json").symlink_to(folder / "index.json")
    (tmp_path / "secret.json").write_text('{"secret": true}')
    (folder / "leak.json").symlink_to(tmp_path / "secret.json")
    (folder / "up").symlink_to(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    # Restored after the test: the installed package was imported by this module.
    monkeypatch.delitem(sys.modules, "comfyui_workflow_templates")
    async with served(tmp_path) as (_port, session):
        async with session.get("/templates/same.json") as inside:
            assert inside.status == 200
            assert await inside.json() == [{"moduleName": "default", "templates": []}]
        for path in ("/templates/leak.json", "/templates/up/secret.json"):
            async with session.get(path) as outside:
                assert outside.status == 404, path
                assert b"secret" not in await outside.read()


async def test_without_the_templates_package_the_index_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed without it (`pip install --no-deps`): the editor shows no templates
    instead of an error (ComfyUI answers 404 there)."""
    monkeypatch.setitem(sys.modules, "comfyui_workflow_templates", None)  # import fails
    async with served(tmp_path) as (_port, session):
        async with session.get("/templates/index.json") as index:
            assert index.status == 200
            assert await index.json() == []
        async with session.get("/templates/default.json") as template:
            assert template.status == 404


def _split_package(site: Path, name: str, files: dict[str, str]) -> Path:
    folder = site / name / "templates"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


async def test_newer_templates_split_over_packages_are_served_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Newer comfyui-workflow-templates releases (0.2 and later) split the folder: the
    indexes and workflows in `comfyui_workflow_templates_json`, thumbnails in media
    bundles. Installed beside the pinned package, theirs are served first, each name from
    the first folder that has it; nothing out of any of them."""
    site = tmp_path / "site"
    new_index = '[{"moduleName": "default", "templates": [{"name": "brand_new"}]}]'
    _split_package(
        site,
        "comfyui_workflow_templates_json",
        {"index.json": new_index, "brand_new.json": '{"nodes": []}', "index_logo.json": "{}"},
    )
    media = _split_package(
        site, "comfyui_workflow_templates_media_image", {"brand_new-1.webp": "W"}
    )
    _split_package(site, "comfyui_workflow_templates_media_api", {"index.json": "[]"})
    (tmp_path / "secret.json").write_text('{"secret": true}')
    (media / "leak.json").symlink_to(tmp_path / "secret.json")
    monkeypatch.syspath_prepend(str(site))
    async with served(tmp_path) as (port, session):
        async with session.get("/templates/index.json") as index:
            assert await index.json() == json.loads(new_index)  # the json package's
        async with session.get("/templates/brand_new-1.webp") as thumbnail:
            assert thumbnail.status == 200
            assert thumbnail.content_type == "image/webp"
        async with session.get("/templates/index_logo.json") as logos:
            assert await logos.json() == {}
        # A name only the pinned package has is still served from it.
        async with session.get("/templates/default.json") as pinned:
            assert pinned.status == 200
            assert (await pinned.json()) == json.loads((TEMPLATES / "default.json").read_text())
        async with session.get("/templates/leak.json") as leak:
            assert leak.status == 404
        assert await _raw_status(port, "/templates/../comfyui_workflow_templates_json") == 404
