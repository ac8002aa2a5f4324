"""`comfyfleet install-comfyui-pack DIR`: the companion pack into a ComfyUI's custom_nodes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from comfyfleet import comfyui_pack
from comfyfleet.managed.pack import copy_pack


def add_pack_parser(commands: Any) -> None:
    pack = commands.add_parser(
        "install-comfyui-pack",
        help="install the companion pack into a ComfyUI (its folder or its custom_nodes)",
    )
    pack.add_argument("comfyui", type=Path, metavar="DIR")


def custom_nodes_of(path: Path) -> Path:
    """`DIR/custom_nodes` for a ComfyUI folder, DIR itself if it is a custom_nodes folder."""
    if path.name == "custom_nodes" and path.is_dir():
        return path
    if (path / "custom_nodes").is_dir():
        return path / "custom_nodes"
    raise ValueError(f"{path} is neither a ComfyUI folder nor its custom_nodes folder")


def install_pack(args: argparse.Namespace) -> int:
    try:
        target = copy_pack(custom_nodes_of(args.comfyui.resolve()))
    except ValueError as exc:
        print(f"comfyfleet: {exc}", file=sys.stderr)
        return 2
    print(f"installed the comfyfleet pack (version {comfyui_pack.VERSION}) in {target}")
    print("restart ComfyUI to load it")
    return 0
