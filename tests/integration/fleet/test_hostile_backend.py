"""A backend is not trusted with the gateway's disk: the output names it reports are
checked before anything is written, kept in history or later deleted, and `/view` of a
file kept on a backend only passes plain names on (a scripted backend on loopback)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.lanes.backend import MAX_FILE_BYTES
from tests.comfyui_replay import ComfyUIReplay
from tests.integration.fleet.scripted import PAYLOAD, ScriptedBackend
from tests.integration.gateway.wire import Served, poll, save_prompt, serve


@asynccontextmanager
async def behind(
    tmp_path: Path, backend: ScriptedBackend | ComfyUIReplay, **settings: Any
) -> AsyncIterator[Served]:
    """A gateway (no local slots) whose one backend, `evil`, is `backend`; once it is up."""
    await backend.start()
    try:
        async with serve(
            tmp_path / "gateway",
            local_slots=0,
            backends=({"url": backend.url, "name": "evil"},),
            **settings,
        ) as served:

            async def up() -> bool:
                listed = (await served.get("/api/fleet/backends"))["backends"]
                return [b["state"] for b in listed] == ["up"]

            await poll(up, what="the backend up")
            yield served
    finally:
        await backend.close()


def files_with_payload(root: Path) -> list[Path]:
    """Every file under `root` holding the bytes the backend sent."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink() and path.read_bytes() == PAYLOAD:
                found.append(path)
    return found


def file_items(outputs: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        item
        for ui in outputs.values()
        for items in ui.values()
        if isinstance(items, list)
        for item in items
        if isinstance(item, dict) and "filename" in item
    ]


# (what is hostile, the output item a backend reports): `{outside}` is a folder beside
# the gateway's data dir.
HOSTILE_ITEMS = {
    "parent": ("../../outside/x.png", {"filename": "../../outside/x.png"}),
    "absolute": ("{outside}/abs.png", {"filename": "{outside}/abs.png"}),
    "inner-parent": ("sub/../../../outside/y.png", {"filename": "sub/../../../outside/y.png"}),
    "backslash": ("..\\..\\outside\\z.png", {"filename": "..\\..\\outside\\z.png"}),
    "drive": ("C:z.png", {"filename": "C:z.png"}),
    "nul": ("n\x00ul.png", {"filename": "n\x00ul.png"}),
    "dot-dot": ("..", {"filename": ".."}),
    "subfolder": ("../../outside", {"filename": "x.png", "subfolder": "../../outside"}),
    "temp": ("../../outside/t.png", {"filename": "../../outside/t.png", "type": "temp"}),
}


@pytest.mark.parametrize("case", list(HOSTILE_ITEMS))
async def test_output_names_that_leave_the_folder_are_refused(tmp_path: Path, case: str) -> None:
    outside = str(tmp_path / "outside")
    hostile, template = HOSTILE_ITEMS[case]
    hostile = hostile.replace("{outside}", outside)
    item = {key: value.replace("{outside}", outside) for key, value in template.items()}
    (tmp_path / "outside").mkdir()
    ui = {"images": [{"subfolder": "", "type": "output", **item}]}
    backend = ScriptedBackend(outputs={"2": ui})
    async with behind(tmp_path, backend, max_attempts=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(1, "hostile"), sock.client_id)
        await sock.done(prompt_id)

        # Nothing was written, neither outside the output folder nor in it.
        assert files_with_payload(tmp_path) == []
        assert os.listdir(tmp_path / "outside") == []
        # The prompt ended as an error that says why; no output names the file.
        job = await served.job(prompt_id)
        assert job["status"] == "failed", job
        error = job["execution_error"]
        assert error["exception_type"] == "comfyfleet.UnsafeOutput"
        assert (error["node_id"], error["node_type"]) == ("2", "SaveImage")
        assert repr(hostile) in error["exception_message"]
        entry = await served.history_entry(prompt_id)
        assert entry["status"]["status_str"] == "error"
        assert entry["status"]["messages"][-1] == ["execution_error", error]
        assert file_items(entry["outputs"]) == []
        # The client was told, in ComfyUI's order: the error, then the done signal.
        assert sock.json_types(prompt_id)[-2:] == ["execution_error", "executing"]


async def test_frames_out_of_protocol_are_ignored(tmp_path: Path) -> None:
    """Text frames no ComfyUI sends (not JSON, not an object, nested past the parser's
    depth) cost the backend's socket nothing: the prompt's own frames still come."""
    junk = ("not json", "[1, 2]", '"text"', '{"type": 5}', "[" * 100_000 + "]" * 100_000)
    ui = {"images": [{"filename": "ok.png", "subfolder": "", "type": "output"}]}
    backend = ScriptedBackend(outputs={"2": ui}, junk=junk)
    async with behind(tmp_path, backend, max_attempts=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(5, "junk"), sock.client_id)
        await sock.done(prompt_id)
        assert (await served.job(prompt_id))["status"] == "completed"
        assert sock.json_types(prompt_id)[-2:] == ["execution_success", "executing"]


async def test_a_file_announced_past_the_cap_is_refused_unread(tmp_path: Path) -> None:
    ui = {"images": [{"filename": "huge.png", "subfolder": "", "type": "output"}]}
    backend = ScriptedBackend(outputs={"2": ui}, announced_size=MAX_FILE_BYTES + 1)
    async with behind(tmp_path, backend, max_attempts=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(6, "huge"), sock.client_id)
        await sock.done(prompt_id)
        job = await served.job(prompt_id)
        assert job["status"] == "failed", job
        assert "allowed" in job["execution_error"]["exception_message"]
        assert files_with_payload(tmp_path) == []


async def test_names_reported_only_in_history_are_refused(tmp_path: Path) -> None:
    fine = {"images": [{"filename": "fine.png", "subfolder": "", "type": "output"}]}
    bad = {"images": [{"filename": "../../escaped.png", "subfolder": "", "type": "output"}]}
    backend = ScriptedBackend(outputs={"2": fine}, history_outputs={"2": bad})
    async with behind(tmp_path, backend, max_attempts=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(2, "late"), sock.client_id)
        await sock.done(prompt_id)
        assert not (tmp_path / "escaped.png").exists()
        entry = await served.history_entry(prompt_id)
        assert entry["status"]["status_str"] == "error"
        error = entry["status"]["messages"][-1][1]
        assert repr("../../escaped.png") in error["exception_message"]
        assert all(i["filename"] != "../../escaped.png" for i in file_items(entry["outputs"]))


async def test_retention_never_deletes_a_file_a_backend_named(tmp_path: Path) -> None:
    victim = tmp_path / "gateway" / "victim.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("keep me")
    named = {"images": [{"filename": "../victim.txt", "subfolder": "", "type": "input"}]}
    backend = ScriptedBackend(outputs={"2": named})
    async with behind(tmp_path, backend, max_attempts=1, history_max_entries=1) as served:
        sock = await served.connect()
        first = await served.submit(save_prompt(3, "a"), sock.client_id)
        await sock.done(first)
        backend.outputs = {"2": {"images": [{"filename": "b.png", "type": "output"}]}}
        second = await served.submit(save_prompt(4, "b"), sock.client_id)
        await sock.done(second)

        await served.gateway.prune_once()

        assert list(await served.get("/history")) == [second]
        assert victim.read_text() == "keep me"


@pytest.mark.parametrize(
    ("subfolder", "filename", "status"),
    [
        ("@evil/../..", "x.png", 403),
        ("@evil/..", "x.png", 403),
        ("@evil/a/../../b", "x.png", 403),
        ("@evil//etc", "passwd", 403),
        ("@evil/..\\..", "x.png", 403),
        ("@evil/C:/Windows", "x.png", 403),
        ("@evil/a\x00b", "x.png", 400),
        ("@evil/ref", "../x.png", 400),
        ("@evil/ref", "..\\x.png", 400),
        ("@evil/ref", "/etc/passwd", 400),
        ("@evil/ref", "C:x.png", 400),
        ("@nobody/ref", "x.png", 404),
    ],
)
async def test_reference_view_passes_only_plain_names_on(
    tmp_path: Path, subfolder: str, filename: str, status: int
) -> None:
    backend = ScriptedBackend()
    async with behind(tmp_path, backend, output_mode="reference") as served:
        params = {"filename": filename, "subfolder": subfolder, "type": "output"}
        async with served.session.get(f"{served.url}/view", params=params) as response:
            await response.read()
            assert response.status == status
        assert backend.views == []  # never asked
        fine = {**params, "filename": "x.png", "subfolder": "@evil/ref/sub"}
        async with served.session.get(f"{served.url}/view", params=fine) as response:
            assert (response.status, await response.read()) == (200, PAYLOAD)
        assert backend.views == [{"filename": "x.png", "subfolder": "ref/sub", "type": "output"}]


@pytest.mark.parametrize("kind", ["../../x", "models", "", "Output", "temp/.."])
async def test_reference_view_passes_only_comfyui_types_on(tmp_path: Path, kind: str) -> None:
    backend = ScriptedBackend()
    async with behind(tmp_path, backend, output_mode="reference") as served:
        params = {"filename": "x.png", "subfolder": "@evil/ref", "type": kind}
        async with served.session.get(f"{served.url}/view", params=params) as response:
            assert (response.status, await response.read()) == (400, b"")
        assert backend.views == []  # never asked
        for fine in ("output", "input", "temp"):
            params["type"] = fine
            async with served.session.get(f"{served.url}/view", params=params) as response:
                assert response.status == 200
        untyped = {"filename": "x.png", "subfolder": "@evil/ref"}  # output, as in ComfyUI
        async with served.session.get(f"{served.url}/view", params=untyped) as response:
            assert response.status == 200
        assert [view.get("type") for view in backend.views] == ["output", "input", "temp", None]
