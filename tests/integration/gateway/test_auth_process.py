"""`comfyfleet serve` with authentication, as a process: flags, the start-up warning, and
tokens kept out of logs, the store and /system_stats."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.gateway.wire import save_prompt
from tests.servers import ServerProcess

TOKEN = "flag-token-9d2c7b1e5a"
FILE_TOKEN = "file-token-3a6f0c8d2e"
WARNING = "not a loopback address, with no authentication"


def wait_for_history(server: ServerProcess, prompt_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        entry = server.get(f"/history/{prompt_id}")
        if entry:
            return dict(entry[prompt_id])
        time.sleep(0.05)
    raise AssertionError(f"no history entry for {prompt_id}")


def status_without_token(server: ServerProcess, path: str) -> int:
    try:
        with urllib.request.urlopen(server.url + path, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


def test_tokens_stay_out_of_logs_store_and_system_stats(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(FILE_TOKEN + "\n")
    args = ("--auth-token", TOKEN, "--auth-token-file", str(tmp_path / "token"))
    server = ServerProcess(tmp_path / "data", *args, "--log-level", "DEBUG", token=TOKEN)
    with server:
        assert status_without_token(server, "/prompt") == 401
        assert status_without_token(server, f"/prompt?token={FILE_TOKEN}") == 200
        reply = server.post("/prompt", {"prompt": save_prompt(1, "p"), "client_id": "c"})
        entry = wait_for_history(server, reply["prompt_id"])
        assert entry["status"]["completed"] is True  # type: ignore[index]
        argv = server.get("/system_stats")["system"]["argv"]
        assert TOKEN not in json.dumps(argv) and "***" in argv
        assert server.terminate() == 0
    log = server.log.read_text()
    assert "authentication on: 2 tokens, tenants ['default']" in log
    assert WARNING not in log
    for path in [server.log, *(tmp_path / "data").rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and FILE_TOKEN.encode() not in data, path


@pytest.mark.parametrize("auth", [False, True])
def test_non_loopback_warning_only_without_auth(tmp_path: Path, auth: bool) -> None:
    args = ["--host", "0.0.0.0"] + (["--auth-token", TOKEN] if auth else [])
    server = ServerProcess(tmp_path / "data", *args, token=TOKEN if auth else None)
    with server:
        assert server.terminate() == 0
    assert (WARNING in server.log.read_text()) is not auth
