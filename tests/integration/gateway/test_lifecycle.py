"""`comfyfleet serve` as a process: start-up, and SIGTERM with and without time to finish."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.gateway.processes import Frames, job, submit, wait_completed
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess


def test_startup_is_quick_and_the_first_log_line_says_where(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    started = time.monotonic()
    server.start()
    try:
        elapsed = time.monotonic() - started
        assert elapsed < 2.0, elapsed
        first = server.log.read_text().splitlines()[0]
        assert f"listening on http://127.0.0.1:{server.port}" in first, first
        assert f"data in {data.resolve()}" in first, first
    finally:
        server.kill()


def test_sigterm_lets_a_running_prompt_finish(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data).start()
    try:
        frames = Frames(server)
        prompt_id = submit(server, sleep_prompt(1.0), frames.client_id)
        frames.progress(prompt_id)
        assert server.terminate(timeout=30) == 0
        # The client saw the prompt through to its done signal before the socket closed.
        frames.done(prompt_id)
        assert frames.types(prompt_id)[-2:] == ["execution_success", "executing"]
        frames.close()
    finally:
        server.kill()
    log = server.log.read_text()
    assert "shutting down" in log and "stopped" in log

    with ServerProcess(data) as again:
        entry = again.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        assert job(again, prompt_id)["attempt"] == 1


def test_sigterm_after_the_grace_requeues_the_prompt_for_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, "--shutdown-grace", "0.2").start()
    try:
        frames = Frames(server)
        prompt_id = submit(server, sleep_prompt(5.0), frames.client_id)
        frames.progress(prompt_id)
        stopping = time.monotonic()
        assert server.terminate(timeout=30) == 0
        assert time.monotonic() - stopping < 4.0  # it did not wait for the 5 s prompt
        frames.close()
    finally:
        server.kill()

    with ServerProcess(data) as again:
        assert job(again, prompt_id)["status"] in ("pending", "in_progress")
        wait_completed(again, prompt_id, timeout=30)
        finished = job(again, prompt_id)
        assert finished["attempt"] == 2
        history = again.get("/history")
        assert list(history) == [prompt_id]
        assert history[prompt_id]["status"]["status_str"] == "success"
