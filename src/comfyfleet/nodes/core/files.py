"""Nodes that read images from, or write them to, the input/output/temp folders."""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
import random
import string
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from comfyfleet import imaging
from comfyfleet.folders import UnsafePath, current_folders, resolve_inside
from comfyfleet.nodes.core.saving import SaveTarget, format_prefix

# Formats Pillow reads that `mimetypes` does not know on every platform.
_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
_ANNOTATIONS = ("input", "output", "temp")


def _is_image_name(name: str) -> bool:
    if Path(name).suffix.lower() in _IMAGE_SUFFIXES:
        return True
    mime, _ = mimetypes.guess_type(name, strict=False)
    return bool(mime and mime.startswith("image/"))


def input_images() -> list[str]:
    """The image files directly inside the input folder, sorted (a link only when it
    leads to a file inside the folder)."""
    folder = current_folders().input
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    return sorted(e.name for e in entries if _is_image_name(e.name) and _file_inside(folder, e))


def _file_inside(folder: Path, entry: os.DirEntry[str]) -> bool:
    if not entry.is_symlink():
        return entry.is_file()
    try:
        return resolve_inside(folder, entry.name).is_file()
    except UnsafePath:
        return False


def annotated_path(name: str) -> Path:
    """The file a LoadImage value names: `sub/x.png` in the input folder, or `x.png [output]`.

    Raises ValueError (UnsafePath) when the name, symlinks resolved, points outside its folder.
    """
    kind = "input"
    for candidate in _ANNOTATIONS:
        tag = f"[{candidate}]"
        if name.endswith(tag):
            name = name.removesuffix(tag).removesuffix(" ")
            kind = candidate
            break
    return current_folders().resolve_inside(kind, name)


class LoadImage:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": (input_images(), {"image_upload": True})}}

    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load_image"
    CATEGORY = "image"

    def load_image(self, image: str) -> tuple[imaging.ImageArray, imaging.MaskArray]:
        with Image.open(annotated_path(image)) as picture:
            return imaging.frames_from_pil(picture)

    @classmethod
    def IS_CHANGED(cls, image: str) -> str:
        digest = hashlib.sha256()
        with open(annotated_path(image), "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()

    @classmethod
    def VALIDATE_INPUTS(cls, image: str) -> bool | str:
        try:
            exists = annotated_path(image).is_file()
        except ValueError:
            exists = False
        return True if exists else f"Invalid image file: {image}"


def _png_text(prompt: Any, extra_pnginfo: Any) -> dict[str, str]:
    """PNG text chunks: the API prompt under "prompt", each extra key (e.g. "workflow") apart."""
    text: dict[str, str] = {}
    if prompt is not None:
        text["prompt"] = json.dumps(prompt)
    if isinstance(extra_pnginfo, dict):
        for key, value in extra_pnginfo.items():
            text[str(key)] = json.dumps(value)
    return text


class SaveImage:
    folder_type = "output"
    compress_level = 4

    def __init__(self) -> None:
        self.prefix_append = ""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "images": ("IMAGE", {"tooltip": "The images to save."}),
                "filename_prefix": (
                    "STRING",
                    {
                        "default": "ComfyUI",
                        "tooltip": "The prefix for the file to save. This may include formatting "
                        "information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% "
                        "to include values from nodes.",
                    },
                ),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    RETURN_TYPES = ()
    FUNCTION = "save_images"
    OUTPUT_NODE = True
    CATEGORY = "image"
    DESCRIPTION = "Saves the input images to your ComfyUI output directory."

    def save_images(
        self,
        images: Any,
        filename_prefix: str = "ComfyUI",
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> dict[str, Any]:
        frames = np.asarray(images)
        root = current_folders().of_type(self.folder_type)
        if root is None:
            raise ValueError(f"Unknown folder type {self.folder_type!r}")
        height, width = frames.shape[1:3]
        prefix = format_prefix(
            filename_prefix + self.prefix_append, width=width, height=height, prompt=prompt
        )
        target = SaveTarget.resolve(root, prefix)
        text = _png_text(prompt, extra_pnginfo)
        counter = target.next_counter(len(frames))
        results = []
        for index, frame in enumerate(frames):
            data = imaging.encode_png(imaging.to_pil(frame), text, self.compress_level)
            name = target.name.replace("%batch_num%", str(index))
            filename, counter = target.write_new(name, counter, data)
            counter += 1
            results.append(
                {"filename": filename, "subfolder": target.subfolder, "type": self.folder_type}
            )
        return {"ui": {"images": results}}


class PreviewImage(SaveImage):
    folder_type = "temp"
    compress_level = 1  # temp files are thrown away; favour speed over size

    def __init__(self) -> None:
        # Random per node instance, so previews of different nodes never share names.
        suffix = "".join(random.choices(string.ascii_lowercase, k=5))
        self.prefix_append = f"_temp_{suffix}"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"images": ("IMAGE",)},
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "LoadImage": LoadImage,
    "SaveImage": SaveImage,
    "PreviewImage": PreviewImage,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadImage": "Load Image",
    "SaveImage": "Save Image",
    "PreviewImage": "Preview Image",
}

PYTHON_MODULES = dict.fromkeys(NODE_CLASS_MAPPINGS, "nodes")
