"""What a prompt may name as an uploaded file on a backend: its own files, nothing of the
tenants' space there, nothing outside the backend's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.folders import Folders
from comfyfleet.lanes.backend import BackendClient, BackendSpec
from comfyfleet.lanes.uploads import ForeignFile, InputPusher, forbidden

LOAD_INFO = {"LoadImage": {"input": {"required": {"image": [["a.png"], {"image_upload": True}]}}}}


def load(name: str) -> dict[str, Any]:
    return {"1": {"class_type": "LoadImage", "inputs": {"image": name}}}


@pytest.mark.parametrize(
    "name",
    [
        "_tenants/bob/x.png",
        "_tenants/default/0123/x.png",
        "./_tenants/bob/x.png",
        "sub/../_tenants/bob/x.png",
        "_tenants\\bob\\x.png",
        "../output/x.png",
        "/etc/passwd",
        "C:/Windows/x.png",
    ],
)
def test_names_in_the_tenants_space_or_outside_are_forbidden(name: str) -> None:
    assert forbidden(name)


@pytest.mark.parametrize("name", ["x.png", "sub/x.png", "_tenantsx/x.png", "a/_tenants/x.png"])
def test_ordinary_names_are_not(name: str) -> None:
    assert not forbidden(name)


async def test_a_prompt_naming_the_tenants_space_without_such_a_file_is_refused(
    tmp_path: Path,
) -> None:
    folders = Folders.under(tmp_path).ensure()
    async with aiohttp.ClientSession() as session:
        # Nothing is sent: the refusal comes before any request (the url goes nowhere).
        client = BackendClient(BackendSpec("http://127.0.0.1:9", "gpu"), session)
        pusher = InputPusher(client, folders, lambda: LOAD_INFO)
        with pytest.raises(ForeignFile) as refused:
            await pusher.push_for(load("_tenants/bob/x.png [input]"), tenant="alice")
        assert (refused.value.node_id, refused.value.name) == ("1", "image")
        # A name of the backend's own (not uploaded here) passes unchanged.
        assert await pusher.push_for(load("a.png"), tenant="alice") == load("a.png")


async def test_upload_inputs_are_read_from_input_types_once_per_class(tmp_path: Path) -> None:
    from comfyfleet.folders import using_folders
    from comfyfleet.lanes.uploads import UploadInputs
    from comfyfleet.nodes import build_registry

    registry = build_registry(testing=True)
    uploads = UploadInputs()
    prompt = {
        **load("sub/a.png [output]"),
        "2": {"class_type": "LoadImage", "inputs": {"image": ["1", 0]}},  # a link
        "3": {"class_type": "EmptyImage", "inputs": {"width": 8}},
        "4": {"class_type": "Unknown", "inputs": {"image": "b.png"}},
    }
    with using_folders(Folders.under(tmp_path).ensure()):
        assert await uploads.values(registry, prompt) == ["sub/a.png [output]"]
        assert await uploads.values(registry, [1]) == []
