"""`comfyfleet serve --store postgresql://...` as a process: prompts run end to end with
jobs and history in PostgreSQL, a restart (even kill -9) finds them there, and the URL's
password shows nowhere."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.integration.gateway.processes import Frames, poll, submit
from tests.integration.gateway.wire import save_prompt, sleep_prompt
from tests.servers import ServerProcess

PASSWORD = "pg-secret-5e1f0a"  # trust authentication accepts any password


def with_password(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"postgres:{PASSWORD}@{parts.hostname}:{parts.port}"))


def history_of(server: ServerProcess, prompt_id: str) -> dict[str, object]:
    entry: dict[str, object] = server.get(f"/history/{prompt_id}").get(prompt_id, {})
    return entry


def test_a_prompt_runs_end_to_end_on_postgres(tmp_path: Path, postgres_database: str) -> None:
    url = with_password(postgres_database)
    server = ServerProcess(tmp_path / "data", "--store", url, "--log-level", "DEBUG")
    with server:
        frames = Frames(server)
        try:
            prompt_id = submit(server, save_prompt(3, "pg"), frames.client_id)
            frames.done(prompt_id)
        finally:
            frames.close()
        assert "execution_success" in frames.types(prompt_id)
        entry = history_of(server, prompt_id)
        assert entry["status"]["completed"] is True  # type: ignore[index]
        [image] = entry["outputs"]["2"]["images"]  # type: ignore[index]
        assert (tmp_path / "data" / "output" / image["filename"]).is_file()
        assert server.get(f"/api/jobs/{prompt_id}")["status"] == "completed"
        argv = server.get("/system_stats")["system"]["argv"]
        assert PASSWORD not in json.dumps(argv) and "postgres:***@" in json.dumps(argv)
        assert server.terminate() == 0
    assert not (tmp_path / "data" / "comfyfleet.db").exists()  # nothing went to SQLite
    log = server.log.read_text()
    assert "store postgresql://postgres:***@" in log
    assert PASSWORD not in log


def test_a_restart_finds_the_queue_and_history_in_postgres(
    tmp_path: Path, postgres_database: str
) -> None:
    url = with_password(postgres_database)
    first = ServerProcess(
        tmp_path / "first", "--store", url, "--local-slots", "1", "--lease", "2s"
    ).start()
    try:
        done = submit(first, save_prompt(1, "before"))
        poll(lambda: bool(history_of(first, done)), what="the first prompt to finish")
        running = submit(first, sleep_prompt(30, 2))
        poll(
            lambda: first.get(f"/api/jobs/{running}")["status"] == "in_progress",
            what="the long prompt to start",
        )
        waiting = submit(first, save_prompt(3, "after"))
    finally:
        first.kill()

    # Another data dir, so another gateway: whatever it knows comes from PostgreSQL. The
    # first one's running prompt is its own until the first one's lease runs out.
    second = ServerProcess(tmp_path / "second", "--store", url, "--local-slots", "2")
    with second:
        assert history_of(second, done)["status"]["completed"] is True  # type: ignore[index]
        poll(lambda: bool(history_of(second, waiting)), what="the waiting prompt to finish")
        poll(
            lambda: second.get(f"/api/jobs/{running}")["attempt"] == 2,
            what="the long prompt to be taken over once the lease ran out",
        )
        job = second.get(f"/api/jobs/{running}")
        assert job["status"] == "in_progress"  # re-queued, run again
        assert list(second.get("/history")) == [done, waiting]
        # The counter goes on past every number the first process handed out.
        assert second.post("/prompt", {"prompt": save_prompt(4, "next")})["number"] == 3
        # A refused prompt advances it too, as in ComfyUI, though an accepted one is
        # numbered as it is stored.
        with pytest.raises(urllib.error.HTTPError) as refused:
            second.post("/prompt", {"prompt": {"1": {"class_type": "NoSuchNode"}}})
        refused.value.close()
        assert refused.value.code == 400
        assert second.post("/prompt", {"prompt": save_prompt(5, "last")})["number"] == 5
    assert f"re-queued {running}: gateway" in second.log.read_text()
