"""A client sees one stream per prompt, as from ComfyUI, however often it runs on the
fleet: one `execution_start`, one end event, one done signal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import (
    Fleet,
    backend_history,
    call,
    fail_prompt,
    last_message,
)
from tests.integration.gateway.processes import Frames

END_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


def stream_of(frames: Frames, prompt_id: str) -> list[str]:
    """The prompt's frame types up to its done signal, then a pause for any stray ones."""
    frames.done(prompt_id)
    frames.ws.settimeout(0.5)
    try:
        while frames.ws.recv():
            pass
    except Exception:  # the timeout: nothing more came
        pass
    frames.events = [e for e in frames.events if isinstance(e.get("data"), dict)]
    return [t for t in frames.types(prompt_id) if t not in ("progress", "progress_state")]


def assert_one_stream(types: list[str], end: str) -> None:
    assert types.count("execution_start") == 1, types
    assert types[0] == "execution_start", types
    assert [t for t in types if t in END_EVENTS] == [end], types
    assert types[-2:] == [end, "executing"], types  # the end, then the done signal


def ran_on(fleet: Fleet, prompt_id: str) -> list[str]:
    return [n for n, b in fleet.backends.items() if backend_history(b, prompt_id) is not None]


def error_of(fleet: Fleet, prompt_id: str) -> dict[str, Any]:
    entry = fleet.history()[prompt_id]
    assert entry["status"]["status_str"] == "error"
    assert last_message(entry) == "execution_error"
    error: dict[str, Any] = entry["status"]["messages"][-1][1]
    return error


def test_a_node_error_ends_the_prompt_at_once_in_one_stream(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=2)
    frames = Frames(fleet.gateway)
    try:
        prompt_id = fleet.submit(fail_prompt("boom on purpose"), frames.client_id)
        assert_one_stream(stream_of(frames, prompt_id), "execution_error")
    finally:
        frames.close()
    job = fleet.job(prompt_id)
    assert (job["status"], job["attempt"]) == ("failed", 1)
    assert job["execution_error"]["exception_message"].strip() == "boom on purpose"
    assert error_of(fleet, prompt_id)["node_type"] == "Fail"
    # The node's own error: not run again anywhere.
    time.sleep(0.5)
    assert len(ran_on(fleet, prompt_id)) == 1
    assert fleet.job(prompt_id)["attempt"] == 1


def test_running_out_of_memory_is_tried_once_more_elsewhere_in_one_stream(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(shared=2)
    frames = Frames(fleet.gateway)
    prompt = fail_prompt("out of memory on purpose")
    prompt["1"]["inputs"]["error"] = "MemoryError"
    try:
        prompt_id = fleet.submit(prompt, frames.client_id)
        assert_one_stream(stream_of(frames, prompt_id), "execution_error")
    finally:
        frames.close()
    job = fleet.job(prompt_id)
    assert (job["status"], job["attempt"]) == ("failed", 2)
    assert sorted(ran_on(fleet, prompt_id)) == ["s0", "s1"]  # once on each
    assert error_of(fleet, prompt_id)["exception_type"] == "MemoryError"


#: A node only the backend has, whose own code refuses a value above `limit`: the
#: gateway's stand-in (from `/object_info`) cannot know.
CHECK_PACK = """
class CheckBelow:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {}), "limit": ("FLOAT", {})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "check"

    @classmethod
    def VALIDATE_INPUTS(cls, value, limit):
        return True if value <= limit else f"value {value} is above the limit {limit}"

    def check(self, value, limit):
        return (value,)


NODE_CLASS_MAPPINGS = {"CheckBelow": CheckBelow}
"""


def test_a_prompt_its_backend_refuses_is_refused_as_the_backend_does(
    make_fleet: MakeFleet, tmp_path: Path
) -> None:
    """A backend that validates for the gateway (comfyfleet does; a ComfyUI with the
    companion pack does): the gateway answers its 400, and queues nothing."""
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "check_below.py").write_text(CHECK_PACK, encoding="utf-8")
    fleet = make_fleet(dedicated=[("--custom-nodes", str(packs))])
    backend = fleet.backends["d0"]
    assert backend.get("/comfyfleet/pack")["pack"] == "comfyfleet"
    prompt: dict[str, dict[str, Any]] = {
        "1": {"class_type": "CheckBelow", "inputs": {"value": 5.0, "limit": 3.0}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    direct = call(backend.url, "POST", "/comfyfleet/validate", {"prompt": prompt})
    assert (status, answer) == direct
    assert status == 400 and answer["error"]["type"] == "prompt_outputs_failed_validation"
    assert "above the limit" in answer["node_errors"]["1"]["errors"][0]["details"]
    assert fleet.gateway.get("/queue") == {"queue_running": [], "queue_pending": []}

    # What the backend accepts, the gateway accepts: the backend's outputs run.
    prompt["1"]["inputs"]["value"] = 2.0
    prompt_id = fleet.submit(prompt)
    assert fleet.wait_job(prompt_id, "completed", "failed")["status"] == "completed"
