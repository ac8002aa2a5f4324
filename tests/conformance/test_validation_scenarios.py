"""validate_prompt against the POST /prompt bodies recorded from ComfyUI 0.3.64.

The recording's first case, a body without a `prompt` key, is answered by the
server before validation runs, so it is not replayed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.engine.validation import validate_prompt
from comfyfleet.folders import Folders, using_folders
from comfyfleet.nodes import build_registry

SCENARIO = (
    Path(__file__).parents[1]
    / "data"
    / "comfyui-reference"
    / "scenarios"
    / "04-validation-errors.json"
)
STEPS: list[dict[str, Any]] = json.loads(SCENARIO.read_text())["steps"]


def _is_prompt_post(step: dict[str, Any]) -> bool:
    return bool(step["kind"] == "http" and step["method"] == "POST" and step["path"] == "/prompt")


def _outputs_to_execute(after: int, prompt_id: str) -> list[str]:
    """The 5th item of the history entry's `prompt`, from the next GET /history step."""
    for step in STEPS[after:]:
        if step["kind"] == "http" and step["path"] == f"/history/{prompt_id}":
            return step["response_json"][prompt_id]["prompt"][4]  # type: ignore[no-any-return]
    raise AssertionError(f"no history step for {prompt_id}")


CASES = [
    pytest.param(index, id=f"step{index}-{step['status']}")
    for index, step in enumerate(STEPS)
    if _is_prompt_post(step) and "prompt" in step["request_json"]
]


def _without_tracebacks(value: Any) -> Any:
    """Replace every `traceback` list by a marker, checking it is a list of strings."""
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if key == "traceback":
                assert isinstance(item, list) and all(isinstance(line, str) for line in item)
                result[key] = "<traceback>"
            else:
                result[key] = _without_tracebacks(item)
        return result
    if isinstance(value, list):
        return [_without_tracebacks(item) for item in value]
    return value


def test_the_recording_has_the_expected_cases() -> None:
    posts = [step for step in STEPS if _is_prompt_post(step)]
    assert len(posts) == 16
    assert len(CASES) == 15  # all but the body without a `prompt` key


@pytest.mark.parametrize("index", CASES)
async def test_recorded_validation(index: int, tmp_path: Path) -> None:
    step = STEPS[index]
    body = step["request_json"]
    registry = build_registry(testing=True)
    with using_folders(Folders.under(tmp_path).ensure()):
        result = await validate_prompt(
            registry, body["prompt"], body.get("partial_execution_targets")
        )
    recorded = step["response_json"]
    if step["status"] == 400:
        assert not result.ok
        assert result.outputs == []
        got = {"error": result.error, "node_errors": result.node_errors}
        json.dumps(got)  # the server sends it as is
        assert _without_tracebacks(got) == _without_tracebacks(recorded)
    else:
        assert step["status"] == 200
        assert result.ok and result.error is None
        assert result.node_errors == recorded["node_errors"]
        assert result.outputs == _outputs_to_execute(index, recorded["prompt_id"])
