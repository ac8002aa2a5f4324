"""Several `comfyfleet serve` processes on one PostgreSQL store: one queue and one
history that any of them answers for, each job run once, and a gateway killed with
prompts in flight loses none of them: another takes its jobs over once its lease has
run out."""

from __future__ import annotations

import itertools
import time
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

from tests.integration.gateway import processes
from tests.integration.gateway.processes import Frames, job, poll, submit
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

LEASE = 2.0


def gateways(
    tmp_path: Path, url: str, count: int, slots: int
) -> ContextManager[list[ServerProcess]]:
    return processes.gateways(tmp_path, url, count, "--local-slots", str(slots), lease=LEASE)


def reached(frames: Frames, prompt_id: str) -> list[str]:
    """The event types of the prompt its client got, up to its done signal (read on)."""
    if not any(
        e["type"] == "executing"
        and e["data"]["node"] is None
        and e["data"]["prompt_id"] == prompt_id
        for e in frames.events
    ):
        frames.done(prompt_id)
    return frames.types(prompt_id)


def finished(server: ServerProcess, ids: list[str]) -> list[str]:
    history = server.get("/history")
    return [prompt_id for prompt_id in ids if prompt_id in history]


def test_three_gateways_share_one_queue_and_history(tmp_path: Path, postgres_database: str) -> None:
    with gateways(tmp_path, postgres_database, 3, 2) as servers:
        listed = servers[0].get("/api/fleet/gateways")
        assert listed["self"] == "gw-0"
        assert [g["id"] for g in listed["gateways"]] == ["gw-0", "gw-1", "gw-2"]
        clients = [Frames(server) for server in servers]
        try:
            ids: list[str] = []
            sent: dict[str, Frames] = {}
            for n, (server, frames) in zip(range(30), itertools.cycle(zip(servers, clients))):
                prompt_id = submit(server, sleep_prompt(0.2, n), frames.client_id)
                ids.append(prompt_id)
                sent[prompt_id] = frames
            poll(lambda: len(finished(servers[2], ids)) == 30, what="every prompt", timeout=90)
            ran_by = {}
            for prompt_id in ids:
                record = job(servers[1], prompt_id)
                assert (record["status"], record["attempt"]) == ("completed", 1)
                ran_by[prompt_id] = record["gateway"]
            assert set(ran_by.values()) == {"gw-0", "gw-1", "gw-2"}  # each took work
            # Each prompt whose client is on the gateway that ran it reached that client.
            for prompt_id, frames in sent.items():
                if frames is clients[int(ran_by[prompt_id][-1])]:
                    assert "execution_success" in reached(frames, prompt_id)
        finally:
            for frames in clients:
                frames.close()


def test_a_killed_gateways_prompts_are_taken_over_none_lost_none_twice(
    tmp_path: Path, postgres_database: str
) -> None:
    with gateways(tmp_path, postgres_database, 2, 4) as (doomed, survivor):
        frames = Frames(survivor)
        try:
            ids, theirs = [], []
            for n in range(300):
                if n % 2:
                    prompt_id = submit(survivor, sleep_prompt(0.5, n % 256), frames.client_id)
                    theirs.append(prompt_id)
                else:
                    prompt_id = submit(doomed, sleep_prompt(0.5, n % 256))
                ids.append(prompt_id)
            poll(lambda: len(finished(survivor, ids)) >= 20, what="some prompts to finish")
            doomed.kill()
            killed_at = time.time()
            poll(lambda: len(finished(survivor, ids)) == 300, what="every prompt", timeout=180)
            records = {p: job(survivor, p) for p in ids}
            # The survivor's client sees each of its prompts that the survivor ran end.
            run_here = [p for p in theirs if records[p]["gateway"] == "gw-1"]
            assert len(run_here) > 100
            assert all("execution_success" in reached(frames, p) for p in run_here)
        finally:
            frames.close()
        history = survivor.get("/history")
        assert all(history[p]["status"]["status_str"] == "success" for p in ids)
        # None ran twice to completion: one end recorded each (fenced by attempt), and only
        # what the killed gateway had running started again, on the survivor: a prompt in
        # each of its 4 slots, and each one that had ended before it whose end was still
        # being recorded (a slot takes its next prompt meanwhile; the done signal waits).
        again = {p for p, record in records.items() if record["attempt"] > 1}
        assert 1 <= len(again) <= 2 * 4, again
        assert all(records[p]["attempt"] == 2 for p in again)
        for prompt_id in again:
            assert records[prompt_id]["gateway"] == "gw-1"
            started = records[prompt_id]["execution_start_time"] / 1000
            assert started - killed_at <= LEASE + 2.0 + 1.0  # lease + 2 s, and a scan's slack
        log = survivor.log.read_text()
        assert "gateway gw-0 is gone" in log
