"""Capability routing: a node only one backend has runs only there; drained, nothing can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import backend_history, call, sleep_prompt

PACK = """
class OnlyHere:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"text": ("STRING", {"default": "hello"})},
            "optional": {"value": ("*", {})},
        }

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"
    CATEGORY = "fleet_test"

    def run(self, text, value=None):
        return {"ui": {"text": ["only here: " + text]}}


NODE_CLASS_MAPPINGS = {"OnlyHere": OnlyHere}
"""


def only_here_prompt(text: str) -> dict[str, Any]:
    """EmptyImage -> Sleep(0.3) -> OnlyHere(text)."""
    prompt = sleep_prompt(0.3)
    prompt["3"] = {"class_type": "OnlyHere", "inputs": {"text": text, "value": ["2", 0]}}
    return prompt


def test_a_node_only_one_backend_has_runs_only_there(make_fleet: MakeFleet, tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "only_here.py").write_text(PACK, encoding="utf-8")
    fleet = make_fleet(shared=1, dedicated=[("--custom-nodes", str(packs))])
    gateway, special, plain = fleet.gateway, fleet.backends["d0"], fleet.backends["s0"]

    # The gateway's object_info is the union: OnlyHere comes from d0 alone.
    assert "OnlyHere" in special.get("/object_info")
    assert "OnlyHere" not in plain.get("/object_info")
    info = gateway.get("/object_info")
    assert "OnlyHere" in info and "Sleep" in info
    assert info["OnlyHere"]["output_node"] is True
    assert gateway.get("/object_info/OnlyHere")["OnlyHere"]["category"] == "fleet_test"

    # s0 is free the whole time, yet never takes them.
    ids = [fleet.submit(only_here_prompt(f"#{i}")) for i in range(3)]
    for i, prompt_id in enumerate(ids):
        job = fleet.wait_job(prompt_id, "completed", "failed")
        assert (job["status"], job["lane"], job["attempt"]) == ("completed", "backend:d0", 1)
        assert backend_history(plain, prompt_id) is None
        assert backend_history(special, prompt_id) is not None
        entry = fleet.history()[prompt_id]
        assert entry["outputs"]["3"] == {"text": [f"only here: #{i}"]}

    # Drained, d0 takes nothing new: a prompt that needs it is refused, ComfyUI-style.
    status, body = call(gateway.url, "POST", "/api/fleet/backends/d0/drain")
    assert (status, body["state"]) == (200, "draining")
    status, body = call(gateway.url, "POST", "/prompt", {"prompt": only_here_prompt("late")})
    assert status == 400, body
    assert set(body) == {"error", "node_errors"} and body["node_errors"] == {}
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}
    assert body["error"]["type"] == "no_lane_can_run"
    assert "OnlyHere" in body["error"]["details"]
    # A prompt s0 can run is still taken.
    other = fleet.submit(sleep_prompt(0.1))
    assert fleet.wait_job(other, "completed")["lane"] == "backend:s0"

    status, body = call(gateway.url, "POST", "/api/fleet/backends/d0/resume")
    assert (status, body["state"]) == (200, "up")
    again = fleet.submit(only_here_prompt("again"))
    job = fleet.wait_job(again, "completed", "failed")
    assert (job["status"], job["lane"]) == ("completed", "backend:d0")
