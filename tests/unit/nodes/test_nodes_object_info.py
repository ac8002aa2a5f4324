"""The core pack describes its nodes exactly as ComfyUI 0.3.64 does in /object_info."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry

REFERENCE = Path(__file__).parents[2] / "data" / "comfyui-reference" / "object_info-core.json"


def _recorded() -> dict[str, dict[str, Any]]:
    steps = json.loads(REFERENCE.read_text())["steps"]
    nodes: dict[str, dict[str, Any]] = {}
    for step in steps:
        if step["kind"] == "http":
            nodes.update(step["response_json"])
    return nodes


RECORDED = _recorded()


def _as_json(value: Any) -> Any:
    """What the server would send: tuples become lists, and so on."""
    return json.loads(json.dumps(value))


def test_reference_covers_the_twenty_core_nodes() -> None:
    assert len(RECORDED) == 20


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_object_info_matches_comfyui(name: str, folders: Folders) -> None:
    expected = json.loads(json.dumps(RECORDED[name]))
    node = build_registry().get(name)
    assert node is not None
    actual = _as_json(node.object_info())
    if name == "LoadImage":
        # The combo lists the input folder's files, which differ from the recording's.
        assert actual["input"]["required"]["image"][0] == []
        actual["input"]["required"]["image"][0] = expected["input"]["required"]["image"][0]
    assert actual == expected


def test_image_blend_display_name_is_null() -> None:
    node = build_registry().get("ImageBlend")
    assert node is not None
    assert node.object_info()["display_name"] is None


def test_load_image_lists_sorted_image_files_of_the_input_folder(folders: Folders) -> None:
    for name in ("b.png", "a.jpg", "C.webp", "notes.txt"):
        (folders.input / name).write_bytes(b"x")
    (folders.input / "sub.png").mkdir()
    node = build_registry().get("LoadImage")
    assert node is not None
    combo = _as_json(node.object_info()["input"]["required"]["image"])
    assert combo == [["C.webp", "a.jpg", "b.png"], {"image_upload": True}]


def test_core_pack_has_multiline_string_and_no_testing_nodes() -> None:
    registry = build_registry()
    node = registry.get("PrimitiveStringMultiline")
    assert node is not None
    info = _as_json(node.object_info())
    assert info["input"]["required"]["value"] == ["STRING", {"multiline": True}]
    assert info["display_name"] == "String (Multiline)"
    assert "TestSleep" not in registry
    assert not registry.failures
