"""`comfyfleet serve --log-format json` as a real process: every line it writes is one JSON
object, lines about a job name it, and secrets never show."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.servers import ServerProcess

TOKEN = "json-log-token-8e1f3a"


def failing_prompt(message: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "Fail", "inputs": {"message": message}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def history_entry(server: ServerProcess, prompt_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry: dict[str, Any] = server.get(f"/history/{prompt_id}").get(prompt_id, {})
        if entry:
            return entry
        time.sleep(0.05)
    raise AssertionError(f"no history entry for {prompt_id}")


def test_every_line_is_json_and_lines_about_a_job_name_it(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "data", "--log-format", "json", "--auth-token", TOKEN, token=TOKEN
    )
    with server:
        body = {"prompt": failing_prompt(f"upstream said: Bearer {TOKEN}")}
        prompt_id = server.post("/prompt", body)["prompt_id"]
        assert history_entry(server, prompt_id)["status"]["status_str"] == "error"
        assert server.terminate() == 0
    text = server.log.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]  # every line, or it fails here
    assert len(lines) >= 3
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    assert any("listening on" in line["message"] for line in lines)
    about_job = [line for line in lines if line.get("prompt_id") == prompt_id]
    failed = [line for line in about_job if "failed" in line["message"]]
    assert failed, text
    assert failed[0]["level"] == "WARNING" and failed[0]["tenant"] == "default"
    assert failed[0]["lane"] == "local" and failed[0]["attempt"] == 1
    assert "RuntimeError: upstream said: Bearer ***" in failed[0]["exception"]
    assert TOKEN not in text
