"""/object_info, /system_stats, /features, /models, /embeddings and /free."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.helpers import REFERENCE, load_scenario
from tests.integration.server.fileserver import serve

_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "NoneType": type(None)}


async def test_object_info_lists_every_node(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        response = await served.client.get("/object_info")
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        info = await response.json()
        assert set(info) == set(served.engine.registry.nodes)
        assert info["EmptyImage"]["name"] == "EmptyImage"


async def test_object_info_replays_the_core_recording(tmp_path: Path) -> None:
    recording = json.loads((REFERENCE / "object_info-core.json").read_text())
    steps = [step for step in recording["steps"] if step["kind"] == "http"]
    assert len(steps) == 20
    async with serve(tmp_path) as served:
        # LoadImage lists the server's input folder: give it the recorded one's content.
        png = served.folders.input / "example.png"
        png.write_bytes(b"")
        for step in steps:
            for path in (step["path"], "/api" + step["path"]):
                response = await served.client.get(path)
                assert response.status == step["status"], path
                assert response.headers["Content-Type"] == step["response_content_type"]
                assert await response.json() == step["response_json"], path


async def test_object_info_reports_broken_nodes_by_leaving_them_out(tmp_path: Path) -> None:
    class Broken:
        fail = False  # registration lists inputs once; later listings fail

        @classmethod
        def INPUT_TYPES(cls) -> dict[str, Any]:
            if cls.fail:
                raise RuntimeError("cannot list")
            return {"required": {}}

        RETURN_TYPES = ("INT",)
        FUNCTION = "run"
        CATEGORY = "test"

    async with serve(tmp_path) as served:
        served.engine.registry.add_pack({"Broken": Broken}, pack="broken", python_module="x")
        assert "Broken" in served.engine.registry
        Broken.fail = True
        response = await served.client.get("/object_info")
        assert response.status == 200
        info = await response.json()
        assert "Broken" not in info and "EmptyImage" in info
        single = await served.client.get("/object_info/Broken")
        assert single.status == 500
        assert (await single.json())["error"]["type"] == "server_error"


async def test_system_stats_has_comfyui_shape(tmp_path: Path) -> None:
    steps = load_scenario("10-misc-endpoints")["steps"]
    recorded = next(s for s in steps if s.get("path") == "/system_stats")["response_json"]
    types = next(s for s in steps if "original_types" in s)["original_types"]
    async with serve(tmp_path) as served:
        response = await served.client.get("/system_stats")
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        stats = await response.json()
    system = stats["system"]
    assert list(system) == [*recorded["system"], "comfyfleet_version"]
    for key, type_name in types["system"].items():
        assert isinstance(system[key], _TYPES[type_name]), key
    assert system["comfyui_version"] == "0.3.64"
    assert system["comfyfleet_version"] == "9.9.9"
    assert system["embedded_python"] is False
    assert isinstance(system["pytorch_version"], str)
    assert system["ram_total"] >= system["ram_free"] >= 0
    [device] = stats["devices"]
    assert list(device) == list(recorded["devices"][0])
    for key, type_name in types["devices[]"].items():
        assert isinstance(device[key], _TYPES[type_name]), key
    assert device["type"] == "cpu"


async def test_features_reports_the_upload_limit(tmp_path: Path) -> None:
    async with serve(tmp_path, max_upload_bytes=12345) as served:
        response = await served.client.get("/api/features")
        assert await response.json() == {
            "supports_preview_metadata": True,
            "max_upload_size": 12345,
        }


async def test_models_lists_files_like_comfyui(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for relative in (
        "checkpoints/b.safetensors",
        "checkpoints/sub/a.CKPT",
        "checkpoints/readme.txt",
        "checkpoints/.git/objects.pt",
        "clip/old.safetensors",
        "text_encoders/new.pt",
        "configs/x.yaml",
        "embeddings/emb.pt",
        "embeddings/notes.md",
    ):
        (models / relative).parent.mkdir(parents=True, exist_ok=True)
        (models / relative).write_bytes(b"")
    os.symlink(models / "checkpoints", models / "checkpoints" / "sub" / "loop")
    async with serve(tmp_path / "data", models_root=models) as served:
        client = served.client
        assert await (await client.get("/models/checkpoints")).json() == [
            "b.safetensors",
            os.path.join("sub", "a.CKPT"),
        ]
        assert await (await client.get("/models/text_encoders")).json() == [
            "new.pt",
            "old.safetensors",
        ]
        assert await (await client.get("/models/configs")).json() == ["x.yaml"]
        assert await (await client.get("/models/loras")).json() == []
        assert await (await client.get("/models/custom_nodes")).json() == []
        assert await (await client.get("/embeddings")).json() == ["emb"]
        unknown = await client.get("/models/unet")  # legacy names are not folder names
        assert unknown.status == 404
        assert unknown.headers.get("Content-Type") is None


async def test_embeddings_are_empty(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        assert await (await served.client.get("/api/embeddings")).json() == []


async def test_free_replies_empty_and_drops_cached_outputs(tmp_path: Path) -> None:
    from comfyfleet.engine.cache import CacheEntry

    async with serve(tmp_path) as served:
        served.engine.cache.put("k", CacheEntry([], None))
        keep = await served.client.post("/free", json={"unload_models": True})
        assert (keep.status, await keep.read()) == (200, b"")
        assert keep.headers.get("Content-Type") is None
        assert len(served.engine.cache) == 1
        free = await served.client.post("/api/free", json={"free_memory": True})
        assert free.status == 200
        assert len(served.engine.cache) == 0
        # A body that is not JSON: ComfyUI's 400, as on every route that reads JSON.
        not_json = await served.client.post("/free", data=b"not json")
        assert not_json.status == 400
        assert (await not_json.json())["error"]["type"] == "invalid_json"
        assert (await served.client.post("/free")).status == 200  # no body at all is fine
