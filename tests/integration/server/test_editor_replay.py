"""The routes the graph editor calls answer as the recorded ComfyUI 0.3.64 did.

tests/data/comfyui-editor/routes.json was recorded from a real ComfyUI 0.3.64 with
frontend 1.27.10 and a fresh user directory (conformance/record_editor_routes.py). The
same requests are replayed in order against a comfyfleet gateway with a fresh data dir;
statuses, content types and bodies must match, with times and sizes compared by type
and the recording machine's paths by being strings. The gateway serves the same editor
(1.27.10, from `make editor-1.27`): `/extensions` lists the editor's own files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from tests.browser.editors import PINNED, needs_pinned
from tests.helpers import DATA
from tests.servers import start_in_process

RECORDING = json.loads((DATA / "comfyui-editor" / "routes.json").read_text())
_PATH = re.compile(r"/(?:tmp|work|home|root|usr|opt|var|srv|mnt)(?:/[^\s\"']*)?")
#: Steps answered differently on purpose, with the answer given here instead.
DEVIATIONS = {
    # ComfyUI's static catch-all answers 404 for a path that is an API route of another
    # method; here it is 405 with Allow, as for every other wrong method.
    ("GET", "/upload/image"): 405,
}


def normal(value: Any) -> Any:
    """Times and sizes as their kinds, machine paths as `<path>`."""
    if isinstance(value, float):
        return "<number>"
    if isinstance(value, str):
        return _PATH.sub("<path>", value)
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    return value


async def _answer(session: aiohttp.ClientSession, base: str, step: dict[str, Any]) -> Any:
    body = step.get("request_body")
    async with session.request(
        step["method"], base + step["path"], data=None if body is None else body.encode()
    ) as response:
        raw = await response.read()
        ctype = response.headers.get("Content-Type")
        return response.status, ctype, raw


def _compare(step: dict[str, Any], status: int, ctype: str | None, raw: bytes) -> None:
    where = f"{step['method']} {step['path']}"
    expected_status = DEVIATIONS.get((step["method"], step["path"]), step["status"])
    assert status == expected_status, where
    if expected_status != step["status"]:
        return
    assert ctype == step["response_content_type"], where
    if "response_json" in step:
        _compare_json(step["path"], step["response_json"], json.loads(raw), where)
    elif "response_text" in step:
        assert raw.decode() == step["response_text"], where
    elif step["path"] not in ("/internal/logs",):
        assert len(raw) == step["response_length"], where


def _compare_json(path: str, recorded: Any, ours: Any, where: str) -> None:
    if path == "/internal/logs/raw":
        assert set(ours) == {"entries", "size"}, where
        assert all(set(e) == {"t", "m"} for e in ours["entries"]), where
        assert set(ours["size"]) == set(recorded["size"]), where
    elif path == "/api/extensions":
        assert set(recorded) <= set(ours), where  # the editor's own, then the packs'
        assert set(ours) - set(recorded) == {"/extensions/comfyfleet/fleet.js"}, where
    elif path == "/internal/folder_paths":
        assert set(ours) == set(recorded), where
        assert all(isinstance(v, list) for v in ours.values()), where
    elif path == "/api/experiment/models":
        assert [f["name"] for f in ours] == [f["name"] for f in recorded], where
    else:
        assert normal(ours) == normal(recorded), where


@needs_pinned
async def test_editor_routes_replay_the_recording(tmp_path: Path) -> None:
    server, _gateway = await start_in_process(tmp_path, local_slots=1, front_end_root=PINNED.root)
    try:
        base = str(server.make_url("")).rstrip("/")
        async with aiohttp.ClientSession() as session:
            for group in ("settings", "userdata", "others"):  # one sequence, in order
                for step in RECORDING["steps"][group]:
                    _compare(step, *await _answer(session, base, step))
    finally:
        await server.close()
