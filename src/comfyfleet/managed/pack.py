"""The companion pack for managed ComfyUI instances, without touching their checkout.

ComfyUI loads every folder a `custom_nodes:` entry of an extra model-paths file names
(`--extra-model-paths-config FILE`) as a custom-nodes folder besides its own: the
gateway keeps a copy of the pack in such a folder under its data dir.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from comfyfleet import comfyui_pack
from comfyfleet.folders import resolve_inside

PACK_NAME = "comfyfleet_pack"


def copy_pack(custom_nodes: Path) -> Path:
    """The pack as `custom_nodes/comfyfleet_pack`, replacing what was there."""
    target = custom_nodes / PACK_NAME
    source = Path(comfyui_pack.__file__).parent
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def pack_paths(root: Path) -> Path:
    """A fresh copy of the pack in `root/custom_nodes`, and the model-paths file (YAML)
    that names that folder: `root/pack_paths.yaml`."""
    root.mkdir(parents=True, exist_ok=True)
    custom_nodes = resolve_inside(root, "custom_nodes")  # a link may not lead out
    custom_nodes.mkdir(exist_ok=True)
    copy_pack(custom_nodes)
    paths = resolve_inside(root, "pack_paths.yaml", follow_last=False)
    paths.unlink(missing_ok=True)  # written anew, never through a link
    # A JSON string is a YAML double-quoted scalar: any folder name stays one value.
    folder = json.dumps(str(custom_nodes), ensure_ascii=False)
    paths.write_text(f"comfyfleet:\n    custom_nodes: {folder}\n", encoding="utf-8")
    return paths


def has_pack(comfyui: Path) -> bool:
    """Whether the pack is installed in that ComfyUI's own custom_nodes (`comfyfleet
    install-comfyui-pack`): a second copy would register its routes twice."""
    return (comfyui / "custom_nodes" / PACK_NAME).exists()
