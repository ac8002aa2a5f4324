"""Kill -9 with prompts running and queued: after a restart every prompt completes exactly once."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.integration.gateway.processes import poll, submit
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

SLOTS = 8
QUEUED = 200
RUNNING_SLEEP = 3.0  # long enough to queue the rest and kill while these still run
QUEUED_SLEEP = 0.2


def prompt(index: int) -> dict[str, Any]:
    """EmptyImage -> Sleep -> SaveImage with a prefix of its own: one file per completion."""
    seconds = RUNNING_SLEEP if index < SLOTS else QUEUED_SLEEP
    return sleep_prompt(seconds, index, output="SaveImage", prefix=f"dur_{index:03}")


def all_jobs(server: ServerProcess) -> dict[str, dict[str, Any]]:
    page = server.get("/api/jobs?limit=1000&sort_order=asc")
    assert page["pagination"]["has_more"] is False
    return {job["id"]: job for job in page["jobs"]}


def history_without_repeats(server: ServerProcess) -> dict[str, Any]:
    """GET /history, failing on a repeated key (json.loads alone would keep the last)."""
    repeated: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        counts = Counter(key for key, _ in pairs)
        repeated.extend(key for key, n in counts.items() if n > 1)
        return dict(pairs)

    with urllib.request.urlopen(f"{server.url}/history", timeout=30) as response:
        history: dict[str, Any] = json.loads(response.read(), object_pairs_hook=unique)
    assert repeated == []
    return history


def test_prompts_survive_a_kill_and_each_completes_exactly_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = ServerProcess(data, "--local-slots", str(SLOTS)).start()
    try:
        running = [submit(first, prompt(i)) for i in range(SLOTS)]
        poll(
            lambda: first.get("/api/jobs?status=in_progress")["pagination"]["total"] == SLOTS,
            what="the first prompts to take every slot",
        )
        with ThreadPoolExecutor(16) as pool:
            queued = list(
                pool.map(lambda i: submit(first, prompt(i)), range(SLOTS, SLOTS + QUEUED))
            )
        at_kill = all_jobs(first)
        assert {p for p, j in at_kill.items() if j["status"] == "in_progress"} == set(running)
        assert {p for p, j in at_kill.items() if j["status"] == "pending"} == set(queued)
    finally:
        first.kill()
    ids = running + queued

    second = ServerProcess(data, "--local-slots", str(SLOTS)).start()
    try:
        poll(
            lambda: (
                second.get("/api/jobs?status=completed&limit=1")["pagination"]["total"] == len(ids)
            ),
            what="every prompt to complete",
            timeout=90,
        )
        assert f"re-queued {SLOTS} jobs" in second.log.read_text()

        history = history_without_repeats(second)
        assert sorted(history) == sorted(ids)  # one entry each
        assert {entry["status"]["status_str"] for entry in history.values()} == {"success"}
        jobs = all_jobs(second)
        assert {p: j["status"] for p, j in jobs.items()} == dict.fromkeys(ids, "completed")
        assert {p: jobs[p]["attempt"] for p in running} == dict.fromkeys(running, 2)
        assert {p: jobs[p]["attempt"] for p in queued} == dict.fromkeys(queued, 1)

        saved = Counter(path.name.rsplit("_", 2)[0] for path in (data / "output").iterdir())
        assert saved == Counter({f"dur_{i:03}": 1 for i in range(len(ids))})

        # The counter goes on from where the first process left it.
        assert second.post("/prompt", {"prompt": prompt(999)})["number"] == len(ids)
    finally:
        second.kill()
