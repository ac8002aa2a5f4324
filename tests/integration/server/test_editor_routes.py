"""The editor's routes beyond the recording: other builds, model files, logs, extensions."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.servers import start_in_process


@asynccontextmanager
async def served(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[str, Any]]:
    server, _gateway = await start_in_process(tmp_path / "data", local_slots=1, **settings)
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as session:
            yield str(server.make_url("")).rstrip("/"), session
    finally:
        await server.close()


async def test_front_end_root_serves_another_build_and_nothing_outside_it(
    tmp_path: Path,
) -> None:
    build = tmp_path / "build"
    (build / "assets").mkdir(parents=True)
    (build / "index.html").write_text("<html>another build</html>")
    (build / "assets" / "app.js").write_text("export {};")
    (tmp_path / "secret.txt").write_text("secret")
    (build / "assets" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    async with served(tmp_path, front_end_root=build) as (_base, session):
        async with session.get("/") as page:
            assert page.status == 200
            assert await page.text() == "<html>another build</html>"
            assert page.headers["Cache-Control"] == "no-cache"
        async with session.get("/assets/app.js") as script:
            assert script.headers["Content-Type"] == "application/javascript"
            assert script.headers["Cache-Control"] == "no-cache"
        for path in ("/assets/leak.txt", "/assets/%2E%2E/%2E%2E/secret.txt", "/nope.js"):
            async with session.get(path) as refused:
                assert refused.status == 404, path


def _safetensors(path: Path, metadata: dict[str, str]) -> None:
    header = json.dumps({"__metadata__": metadata, "w": {"dtype": "F32", "shape": [1]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)


async def test_model_files_metadata_and_previews(tmp_path: Path) -> None:
    checkpoints = tmp_path / "data" / "models" / "checkpoints"
    (checkpoints / "sub").mkdir(parents=True)
    _safetensors(checkpoints / "sub" / "model.safetensors", {"format": "pt"})
    (checkpoints / "notes.txt").write_text("not a model")
    from PIL import Image

    Image.new("RGB", (4, 4), (255, 0, 0)).save(checkpoints / "sub" / "model.png")
    async with served(tmp_path) as (_base, session):
        async with session.get("/api/experiment/models/checkpoints") as listing:
            files = await listing.json()
        assert [(f["name"], f["pathIndex"]) for f in files] == [("sub/model.safetensors", 0)]
        assert files[0]["size"] == (checkpoints / "sub" / "model.safetensors").stat().st_size
        query = "?filename=sub/model.safetensors"
        async with session.get("/api/view_metadata/checkpoints" + query) as metadata:
            assert await metadata.json() == {"format": "pt"}
        async with session.get("/api/view_metadata/checkpoints?filename=../x.safetensors") as out:
            assert out.status == 404
        preview = "/api/experiment/models/preview/checkpoints/0/sub/model.safetensors"
        async with session.get(preview) as picture:
            assert picture.headers["Content-Type"] == "image/webp"
            assert (await picture.read())[:4] == b"RIFF"
        async with session.get("/api/experiment/models/preview/checkpoints/0/..%2Fx") as none:
            assert none.status == 404


async def test_internal_files_newest_first_per_folder(tmp_path: Path) -> None:
    async with served(tmp_path) as (_base, session):
        inputs = tmp_path / "data" / "input"
        for age, name in enumerate(["new.png", "old.png"]):
            (inputs / name).write_bytes(b"x")
            os.utime(inputs / name, (1_000_000 - age * 100, 1_000_000 - age * 100))
        (inputs / "folder").mkdir()
        async with session.get("/internal/files/input") as files:
            assert await files.json() == ["new.png", "old.png"]
        async with session.get("/api/internal/files/input") as no_alias:
            assert no_alias.status == 404  # as in ComfyUI: /internal has no /api twin


async def test_logs_are_kept_and_sent_to_subscribers(tmp_path: Path) -> None:
    async with served(tmp_path) as (_base, session):
        async with session.ws_connect("/ws?clientId=terminal") as ws:
            await ws.receive_json()  # status
            body = {"clientId": "terminal", "enabled": True}
            async with session.patch("/internal/logs/subscribe", json=body) as subscribed:
                assert subscribed.status == 200
            logging.getLogger("comfyfleet.test").warning("a line for the terminal")
            frame = await asyncio.wait_for(ws.receive_json(), 5)
            assert frame["type"] == "logs"
            assert "a line for the terminal" in frame["data"]["entries"][-1]["m"]
            assert set(frame["data"]["size"]) == {"cols", "rows"}
        async with session.get("/internal/logs/raw") as raw:
            entries = (await raw.json())["entries"]
        assert any("a line for the terminal" in e["m"] for e in entries)
        async with session.patch("/internal/logs/subscribe", json={"clientId": "x"}) as bad:
            assert bad.status == 400


async def test_extensions_of_local_packs_are_listed_and_served(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    (packs / "widgets" / "js").mkdir(parents=True)
    (packs / "widgets" / "__init__.py").write_text(
        "NODE_CLASS_MAPPINGS = {}\nWEB_DIRECTORY = './js'\n"
    )
    (packs / "widgets" / "js" / "widget.js").write_text("export const w = 1;")
    async with served(tmp_path, custom_nodes=(packs,)) as (_base, session):
        async with session.get("/extensions") as listing:
            extensions = await listing.json()
        assert "/extensions/widgets/widget.js" in extensions
        assert "/extensions/comfyfleet/fleet.js" in extensions
        assert "/extensions/core/groupNode.js" in extensions
        async with session.get("/extensions/widgets/widget.js") as script:
            assert script.headers["Content-Type"] == "application/javascript"
            assert await script.text() == "export const w = 1;"
        async with session.get("/extensions/widgets/..%2F__init__.py") as outside:
            assert outside.status == 404
        async with session.get("/extensions/comfyfleet/fleet.js") as own:
            assert "registerExtension" in await own.text()


async def test_routes_of_the_newer_editor_subgraph_blueprints_and_template_logos(
    tmp_path: Path,
) -> None:
    """Frontend 1.58 asks for the node packs' subgraph blueprints (none here: `{}`, one
    by id `null`, as ComfyUI answers) and the templates' provider logos, which the pinned
    templates package lacks: an empty index, not a 404 the editor logs."""
    async with served(tmp_path) as (_base, session):
        for prefix in ("", "/api"):
            async with session.get(f"{prefix}/global_subgraphs") as blueprints:
                assert blueprints.status == 200
                assert await blueprints.json() == {}
            async with session.get(f"{prefix}/global_subgraphs/abc123") as one:
                assert one.status == 200
                assert await one.json() is None
        async with session.get("/templates/index_logo.json") as logos:
            assert logos.status == 200
            assert logos.content_type == "application/json"
            assert await logos.json() == {}
        async with session.get("/templates/index_other.json") as other:
            assert other.status == 404
