"""Replay the recorded prompts of the reference scenarios on the engine.

For every prompt a scenario posted with a client_id, the engine's events must
follow the recorded sequence (event types, node order, payload keys), and the
history pieces (outputs, status) must have the recorded shape. `status`
frames belong to the server, not the engine, and are left out here.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import pytest

from comfyfleet.engine.events import PreviewImage, ProgressText
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.run import ExecutionRequest, RunHandle
from tests.helpers import Recorder, load_scenario


@dataclass
class Replay:
    scenario: str
    index: int
    request: dict[str, Any]
    frames: list[dict[str, Any]]
    history: dict[str, Any] | None


def replays(name: str) -> list[Replay]:
    steps = load_scenario(name)["steps"]
    found: list[Replay] = []
    for i, step in enumerate(steps):
        body = step.get("request_json") or {}
        if step["kind"] != "http" or step["path"] != "/prompt" or step["status"] != 200:
            continue
        client = body.get("client_id")
        if client is None:
            continue
        later = steps[i + 1 :]
        frames = next(s["frames"] for s in later if s["kind"] == "ws" and s["client_id"] == client)
        path = f"/history/{step['response_json']['prompt_id']}"
        history = next((s["response_json"] for s in later if s.get("path") == path), None)
        found.append(Replay(name, len(found), body, frames, history))
    return found


ALL = [
    r
    for name in (
        "01-success",
        "02-cached",
        "03-preview-frames",
        "04-validation-errors",
        "05-runtime-error",
        "06-interrupt",
        "09-no-client-id",
    )
    for r in replays(name)
]


def recorded_output_order(replay: Replay, outputs: list[str]) -> list[str]:
    """ComfyUI keeps outputs in a string set (order random per process): use the recorded one."""
    seen = [
        f["data"]["node"]
        for f in replay.frames
        if f.get("type") in ("executing", "executed") and f["data"]["node"] in outputs
    ]
    ordered = list(dict.fromkeys(seen))
    return ordered + [o for o in outputs if o not in ordered]


def normalize(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    """Event types with their node, repeated progress updates folded into one."""
    out: list[tuple[str, Any]] = []
    last_state: Any = None
    for kind, data in events:
        if kind == "status":
            continue
        if kind == "progress_state":
            key: Any = tuple(sorted((n, v["state"]) for n, v in data["nodes"].items()))
            if key == last_state:
                continue
            last_state = key
        elif kind in ("executing", "executed", "progress"):
            key = data.get("node")
        else:
            key = None
        if out and out[-1] == (kind, key) and kind == "progress":
            continue
        out.append((kind, key))
    return out


def recorded_json(frames: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f["type"], f["data"]) for f in frames if not f.get("binary")]


@pytest.mark.parametrize("replay", ALL, ids=lambda r: f"{r.scenario}#{r.index}")
async def test_event_sequence_matches_recording(engine: Engine, replay: Replay) -> None:
    if replay.scenario == "02-cached":
        await engine.run_prompt(replays("01-success")[0].request["prompt"])
    sink = Recorder()
    handle = RunHandle()
    interrupt = any(f.get("type") == "execution_interrupted" for f in replay.frames)
    if interrupt:
        asyncio.get_running_loop().call_later(0.4, handle.interrupt)
    checked = await engine.validate(
        replay.request["prompt"], replay.request.get("partial_execution_targets")
    )
    request = ExecutionRequest("p", checked.prompt, recorded_output_order(replay, checked.outputs))
    result = await engine.execute(request, sink, handle)
    assert result is not None
    ours = [(m.type, m.data) for m in sink.messages()]
    recorded = recorded_json(replay.frames)
    assert normalize(ours) == normalize(recorded)
    assert_same_keys(ours, recorded)
    assert_binary_frames(sink, replay.frames)
    if replay.history is not None:
        assert_history_shape(checked.outputs, result, next(iter(replay.history.values())))


def assert_same_keys(
    ours: list[tuple[str, dict[str, Any]]], recorded: list[tuple[str, dict[str, Any]]]
) -> None:
    def variant(kind: str, data: dict[str, Any]) -> tuple[str, bool]:
        return kind, kind == "executing" and data["node"] is None

    expected = {variant(kind, data): set(data) for kind, data in recorded}
    for kind, data in ours:
        if variant(kind, data) in expected:
            assert set(data) == expected[variant(kind, data)], kind
        if kind == "progress_state":
            for entry in data["nodes"].values():
                ref = next(d for k, d in recorded if k == "progress_state")
                assert set(entry) == set(next(iter(ref["nodes"].values())))


def assert_binary_frames(sink: Recorder, frames: list[dict[str, Any]]) -> None:
    previews = [e for e in sink.events if isinstance(e, PreviewImage)]
    texts = [e for e in sink.events if isinstance(e, ProgressText)]
    binary = [f for f in frames if f.get("binary")]
    assert len(previews) == sum(1 for f in binary if f["event_code"] in (1, 4))
    assert [t.text for t in texts] == [f["text"] for f in binary if f["event_code"] == 3]
    for preview in previews:
        assert preview.format == "PNG" and preview.data.startswith(b"\x89PNG")


TEMP_NAME = re.compile(r"ComfyUI_temp_[a-z]{5}_\d{5}_\.png")


def assert_history_shape(outputs_to_run: list[str], result: Any, history: dict[str, Any]) -> None:
    assert sorted(outputs_to_run) == sorted(history["prompt"][4])
    assert result.status_record()["status_str"] == history["status"]["status_str"]
    assert result.completed == history["status"]["completed"]
    assert [m[0] for m in result.messages] == [m[0] for m in history["status"]["messages"]]
    assert set(result.outputs) == set(history["outputs"])
    assert set(result.meta) == set(history["meta"])
    for node_id, ui in history["outputs"].items():
        ours = result.outputs[node_id]
        assert set(ours) == set(ui)
        for key, items in ui.items():
            assert len(ours[key]) == len(items)
            for mine, theirs in zip(ours[key], items, strict=True):
                if isinstance(theirs, dict) and theirs.get("type") == "temp":
                    assert TEMP_NAME.fullmatch(mine["filename"]), mine
                else:
                    assert mine == theirs
