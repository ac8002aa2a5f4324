"""Node packs: built-in, custom (file and package), failures, object_info."""

from __future__ import annotations

import textwrap
from pathlib import Path

from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry

GOOD_PACK = """
class Doubler:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1, "min": 0, "max": 100})}}

    RETURN_TYPES = ("INT",)
    RETURN_NAMES = ("doubled",)
    FUNCTION = "double"
    CATEGORY = "tests/custom"
    DESCRIPTION = "Doubles an int."

    def double(self, value):
        return (value * 2,)


class ShowInt:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {})}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "show"

    def show(self, value):
        return {"ui": {"text": [str(value)]}}


class EmptyImage:  # tries to replace a built-in
    pass


NODE_CLASS_MAPPINGS = {"Doubler": Doubler, "ShowInt": ShowInt, "EmptyImage": EmptyImage}
NODE_DISPLAY_NAME_MAPPINGS = {"Doubler": "Double It"}
"""


def write_packs(root: Path) -> Path:
    packs = root / "custom_nodes"
    packs.mkdir()
    (packs / "good_pack.py").write_text(textwrap.dedent(GOOD_PACK))
    (packs / "broken_pack.py").write_text("raise ImportError('needs a GPU library')\n")
    folder = packs / "folder_pack"
    folder.mkdir()
    (folder / "__init__.py").write_text("from .nodes import NODE_CLASS_MAPPINGS\n")
    (folder / "nodes.py").write_text(
        "class Hello:\n"
        "    @classmethod\n"
        "    def INPUT_TYPES(cls):\n"
        "        return {'required': {}}\n"
        "    RETURN_TYPES = ('STRING',)\n"
        "    FUNCTION = 'hello'\n"
        "    def hello(self):\n"
        "        return ('hello',)\n"
        "NODE_CLASS_MAPPINGS = {'Hello': Hello}\n"
    )
    (packs / "notes.txt").write_text("not a pack")
    return packs


async def test_custom_pack_loads_and_runs(tmp_path: Path) -> None:
    registry = build_registry(custom_nodes=[write_packs(tmp_path)])
    assert {"Doubler", "ShowInt", "Hello", "EmptyImage", "SaveImage"} <= set(registry.nodes)
    engine = Engine(registry, Folders.under(tmp_path / "data"))
    try:
        prompt = {
            "1": {"class_type": "Doubler", "inputs": {"value": 21}},
            "2": {"class_type": "ShowInt", "inputs": {"value": ["1", 0]}},
        }
        checked, result = await engine.run_prompt(prompt)
        assert checked.ok and result is not None
        assert result.outputs == {"2": {"text": ["42"]}}
        info = engine.object_info("Doubler")["Doubler"]
        assert info["display_name"] == "Double It"
        assert info["output_name"] == ["doubled"]
        assert info["python_module"] == "custom_nodes.good_pack"
        assert info["input"]["required"]["value"] == ["INT", {"default": 1, "min": 0, "max": 100}]
        assert info["description"] == "Doubles an int."
        assert engine.object_info("Nope") == {}
    finally:
        engine.close()


def test_broken_pack_is_reported_and_skipped(tmp_path: Path) -> None:
    registry = build_registry(custom_nodes=[write_packs(tmp_path)])
    broken = [f for f in registry.failures if f.pack == "broken_pack"]
    assert len(broken) == 1
    assert "ImportError: needs a GPU library" in broken[0].error
    assert broken[0].path.endswith("broken_pack.py")


def test_custom_pack_cannot_replace_a_builtin(tmp_path: Path) -> None:
    registry = build_registry(custom_nodes=[write_packs(tmp_path)])
    node = registry.get("EmptyImage")
    assert node is not None and node.python_module == "nodes"
    assert any("EmptyImage" in f.error and f.pack == "good_pack" for f in registry.failures)


def test_missing_custom_nodes_dir_is_reported(tmp_path: Path) -> None:
    registry = build_registry(custom_nodes=[tmp_path / "nowhere"])
    assert [f.error for f in registry.failures] == ["not a directory"]
    assert "SaveImage" in registry.nodes


def test_testing_pack_only_on_request() -> None:
    assert "Sleep" not in build_registry().nodes
    assert {"Sleep", "Fail", "Progress", "TestSleep", "TestSyncError"} <= set(
        build_registry(testing=True).nodes
    )


def test_input_types_are_read_at_each_call_and_parsed_again_only_when_they_change() -> None:
    from comfyfleet.engine.nodedef import NodeDef

    class Files:
        listed = ["a.png"]

        @classmethod
        def INPUT_TYPES(cls) -> dict[str, object]:
            return {"required": {"image": (list(cls.listed),)}}

        RETURN_TYPES = ()
        FUNCTION = "run"

    node = NodeDef("Files", Files, display_name=None, python_module="tests")
    first = node.input_types()
    assert node.input_types() is first  # the same answer: not parsed again
    Files.listed.append("b.png")
    changed = node.input_types()
    assert changed.get("image") is not None
    assert changed.get("image").type == ["a.png", "b.png"]  # type: ignore[union-attr]
