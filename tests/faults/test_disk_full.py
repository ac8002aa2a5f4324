"""The data dir's file system fills up: new prompts get a clear 503, accepted ones are
kept, and the service resumes by itself when space returns."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from tests.faults.helpers import assert_outputs_present, job_counts, save_sleep_prompt
from tests.integration.fleet.harness import call, poll, unique_history
from tests.servers import ServerProcess

pytestmark = pytest.mark.faults

DISK_SIZE = "24m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_SIZE mounted for this test (needs root and mount rights)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path: Path) -> int:
    """Write zeros to `path` until the file system says it is full; bytes written."""
    written = 0
    chunk = b"\0" * (1 << 16)
    with open(path, "wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            written += out.write(chunk)
    # Small writes squeeze out the last partial block.
    with open(path, "ab", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            written += out.write(b"\0" * 512)
    return written


TEXT_PROMPT = {
    "1": {"class_type": "Sleep", "inputs": {"value": "kept", "seconds": 1.5}},
    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
}


def submit(server: ServerProcess, prefix: str, seconds: float) -> tuple[int, Any, dict[str, str]]:
    return post(server, save_sleep_prompt(prefix, seconds))


def post(server: ServerProcess, prompt: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
    """POST /prompt: (status, JSON body, headers), error statuses included."""
    body = json.dumps({"prompt": prompt}).encode()
    request = Request(
        server.url + "/prompt", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read()), dict(exc.headers)


def test_disk_full_gives_503_keeps_accepted_and_recovers(small_disk: Path, tmp_path: Path) -> None:
    server = ServerProcess(small_disk / "data", "--local-slots", "1")
    server.log = tmp_path / "server.log"  # the log must not compete for the small disk
    with server:
        accepted: dict[str, str] = {}
        # Runs first and ends while the disk is full: recording its end must wait for
        # space, not leave it running. It saves no file (SaveImage itself would fail then).
        status, body, _ = post(server, TEXT_PROMPT)
        assert status == 200, body
        accepted[body["prompt_id"]] = "text"
        for n in range(5):
            status, body, _ = submit(server, f"dk{n}", 0.05)
            assert status == 200, body
            accepted[body["prompt_id"]] = f"dk{n}"

        filler = small_disk / "filler"
        assert fill(filler) > 0
        refused = 0
        for n in range(5):
            status, body, headers = submit(server, f"full{n}", 0.05)
            assert status == 503, (status, body)
            assert body["error"]["type"] == "store_unavailable", body
            assert body["error"]["message"] and body["node_errors"] == {}
            assert int(headers["Retry-After"]) >= 1
            refused += 1
        # Reads keep working while the disk is full.
        assert call(server.url, "GET", "/queue")[0] == 200
        assert call(server.url, "GET", "/history")[0] == 200
        time.sleep(2.0)  # the first prompt ends (and tries to record it) while the disk is full

        filler.unlink()  # space returns

        def settled() -> bool:
            counts = job_counts(server)
            return counts["pending"] == 0 and counts["in_progress"] == 0

        poll(settled, what="the accepted prompts to settle", timeout=30)
        history = unique_history(server)
        assert set(accepted) <= set(history), "an accepted prompt was lost"
        assert {history[p]["status"]["status_str"] for p in accepted} == {"success"}
        assert_outputs_present(server.data_dir, history, accepted)

        # New submissions are taken again, and run.
        status, body, _ = submit(server, "after", 0.05)
        assert status == 200, body
        poll(
            lambda: job_counts(server)["completed"] == len(accepted) + 1,
            what="the prompt submitted after recovery to complete",
        )
        assert refused == 5
