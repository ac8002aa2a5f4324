"""The gateway in front of a backend that answers as a recorded real ComfyUI 0.3.64 did
(`tests/data/comfyui-fleet/`): what its client sees is what ComfyUI's own client sees,
with the companion pack and without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.comfyui_replay import ComfyUIReplay, case_prompt, load_case
from tests.integration.fleet.test_hostile_backend import behind
from tests.integration.gateway.wire import Served

END_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


async def run_through(served: Served, name: str) -> tuple[list[str], dict[str, Any]]:
    """Submit a case's prompt with a client; (its frame types, its history entry)."""
    sock = await served.connect()
    prompt_id = await served.submit(case_prompt(name), sock.client_id)
    await sock.done(prompt_id)
    types = [t for t in sock.json_types(prompt_id) if t not in ("progress", "progress_state")]
    return types, await served.history_entry(prompt_id)


def recorded_types(name: str) -> list[str]:
    """The frame types ComfyUI sent for the case's prompt (as `run_through` lists them)."""
    frames = load_case(name)["frames"]
    skipped = ("progress", "progress_state", "status")
    return [f["type"] for f in frames if not f.get("binary") and f["type"] not in skipped]


def assert_one_stream(types: list[str], end: str) -> None:
    assert types.count("execution_start") == 1, types
    assert [t for t in types if t in END_EVENTS] == [end], types
    assert types[-2:] == [end, "executing"], types


async def test_without_the_pack_a_refusal_at_the_backend_ends_the_prompt_with_its_errors(
    tmp_path: Path,
) -> None:
    backend = ComfyUIReplay(("custom-validation-refused",))
    async with behind(tmp_path, backend) as served:
        types, entry = await run_through(served, "custom-validation-refused")
    refused = load_case("custom-validation-refused")["submit"]
    assert refused["status"] == 400  # what ComfyUI answered its own client
    assert types == ["execution_start", "execution_error", "executing"]
    error = entry["status"]["messages"][-1][1]
    assert entry["status"]["status_str"] == "error"
    assert error["node_errors"] == refused["body"]["node_errors"]
    assert error["error"] == refused["body"]["error"]
    assert error["node_type"] == "TestCustomValidation1"
    assert len(backend.submits) == 1  # not retried


async def test_with_the_pack_the_gateway_answers_the_backends_400(tmp_path: Path) -> None:
    backend = ComfyUIReplay(("custom-validation-refused", "async-validation-refused"), pack=True)
    async with behind(tmp_path, backend) as served:
        for name in ("custom-validation-refused", "async-validation-refused"):
            reply = await served.post("/prompt", {"prompt": case_prompt(name)})
            recorded = load_case(name)["submit"]
            assert (reply.status, reply.json) == (recorded["status"], recorded["body"]), name
        assert (await served.get("/queue"))["queue_pending"] == []
    assert backend.submits == []


async def test_the_gateway_is_never_stricter_than_its_backend(tmp_path: Path) -> None:
    """ComfyUI skips min/max for inputs a node's VALIDATE_INPUTS takes; the gateway's
    stand-in cannot know, so it leaves them to the backend."""
    backend = ComfyUIReplay(("kwargs-validation-lifts-max",))
    async with behind(tmp_path, backend) as served:
        types, entry = await run_through(served, "kwargs-validation-lifts-max")
        [saved] = entry["outputs"]["2"]["images"]
        data_dir = served.data_dir
    assert entry["status"]["status_str"] == "success"
    assert_one_stream(types, "execution_success")
    assert types == recorded_types("kwargs-validation-lifts-max")
    recorded = load_case("kwargs-validation-lifts-max")
    [(key, _data)] = recorded["files"].items()
    assert key.endswith("/" + saved["filename"])
    assert (data_dir / "output" / saved["subfolder"] / saved["filename"]).is_file()


async def test_a_runtime_error_reaches_the_client_as_comfyui_sends_it(tmp_path: Path) -> None:
    backend = ComfyUIReplay(("runtime-error",))
    async with behind(tmp_path, backend) as served:
        types, entry = await run_through(served, "runtime-error")
    assert types == recorded_types("runtime-error")
    assert_one_stream(types, "execution_error")
    recorded = load_case("runtime-error")["history"]["status"]["messages"][-1][1]
    error = entry["status"]["messages"][-1][1]
    assert error["exception_message"] == recorded["exception_message"]
    assert error["node_type"] == "TestSyncError"
    assert len(backend.submits) == 1  # a node's own error: not run again


async def test_with_the_pack_a_prompt_with_one_invalid_output_runs_the_valid_one(
    tmp_path: Path,
) -> None:
    backend = ComfyUIReplay(("one-output-invalid",), pack=True)
    recorded = load_case("one-output-invalid")
    async with behind(tmp_path, backend) as served:
        sock = await served.connect()
        reply = await served.post(
            "/prompt", {"prompt": case_prompt("one-output-invalid"), "client_id": sock.client_id}
        )
        assert reply.status == 200
        assert reply.json["node_errors"] == recorded["submit"]["body"]["node_errors"]
        prompt_id = reply.json["prompt_id"]
        await sock.done(prompt_id)
        entry = await served.history_entry(prompt_id)
    assert entry["status"]["status_str"] == "success"
    [submitted] = backend.submits
    assert submitted["partial_execution_targets"] == recorded["validate"]["body"]["outputs"]
    assert set(entry["outputs"]) == set(recorded["history"]["outputs"])
