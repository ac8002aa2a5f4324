"""The fleet dashboard's data (`/api/fleet/status`, `/api/fleet/ws`, `/api/fleet/charts`):
running prompts with their progress, the queue's head with wait times, recent ends,
failures and outputs, fan-out collectors' slots, the charts; each tenant sees its own, an
admin the whole fleet."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path
from typing import Any

from tests.emulators import start_emulator
from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import Served, poll, save_prompt, serve, sleep_prompt

KEY = "emulator-key-7f3a9c"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "flux-concurrent.json"


async def _status(served: Served) -> dict[str, Any]:
    status: dict[str, Any] = await served.get("/api/fleet/status")
    return status


async def test_running_prompts_their_progress_and_the_queue_head(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        running = await served.submit(sleep_prompt(1.0, 1), "watcher")
        waiting = await served.submit(sleep_prompt(0.1, 2), "watcher")

        async def progressing() -> bool:
            jobs = (await _status(served))["running"]
            return bool(jobs) and jobs[0]["value"] > 0

        await poll(progressing, what="the running prompt's progress")
        status = await _status(served)
        [job] = status["running"]
        assert (job["id"], job["lane"], job["state"], job["node"]) == (
            running,
            "local",
            "running",
            "2",
        )
        assert 0 < job["value"] <= job["max"]
        assert status["queue"]["pending"] == 1
        [head] = status["queue"]["head"]
        assert head["id"] == waiting and head["wait"] >= 0 and head["own"]
        assert status["lanes"][0] == {
            "name": "local",
            "kind": "local",
            "state": "up",
            "slots": 1,
            "running": [running],
            "prefetched": [],
        }
        assert status["admin"] is True  # authentication off: one user, who runs it all

        async def both_done() -> bool:
            finished: dict[str, int] = (await _status(served))["queue"]["finished"]
            return finished.get("completed") == 2

        await poll(both_done, what="both prompts finished")
        status = await _status(served)
        assert [r["id"] for r in status["recent"]] == [waiting, running]
        assert status["running"] == [] and status["queue"]["head"] == []


async def test_each_tenant_sees_its_own_prompts_and_files_an_admin_the_fleet(
    tmp_path: Path,
) -> None:
    async with tenants(tmp_path) as clients:
        mine = await clients.alice.submit(save_prompt(3, "alice"))
        theirs = await clients.bob.submit(save_prompt(4, "bob"))

        async def finished(who: Served) -> bool:
            return len((await _status(who))["recent"]) >= 1

        for client in (clients.alice, clients.bob):
            await poll(functools.partial(finished, client), what="a prompt finished")

        async def all_finished() -> bool:
            return len((await _status(clients.root))["recent"]) == 2

        await poll(all_finished, what="the admin sees both")
        alice = await _status(clients.alice)
        assert [r["id"] for r in alice["recent"]] == [mine]
        assert [o["filename"][:5] for o in alice["outputs"]] == ["alice"]
        assert alice["admin"] is False and "url" not in json.dumps(alice["lanes"])
        root = await _status(clients.root)
        assert {r["id"] for r in root["recent"]} == {mine, theirs}
        assert root["outputs"] == []  # its own tenant's files only
        assert root["admin"] is True


def fail_prompt(message: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "Fail", "inputs": {"message": message}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


async def test_recent_failures_and_the_charts_each_viewer_is_shown(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        failed = await clients.alice.submit(fail_prompt("<b>out of memory</b>"))
        await clients.bob.submit(save_prompt(4, "bob"))

        async def both_ended() -> bool:
            return len((await _status(clients.root))["recent"]) == 2

        await poll(both_ended, what="both prompts ended")
        root, alice, bob = [await _status(c) for c in (clients.root, clients.alice, clients.bob)]
        [failure] = root["failures"]
        assert (failure["id"], failure["tenant"], failure["lane"]) == (failed, "alice", "local")
        assert (failure["node_id"], failure["node_type"]) == ("1", "Fail")
        assert failure["exception_type"] == "RuntimeError"
        assert failure["message"] == "<b>out of memory</b>"  # as it came: the page escapes
        assert alice["failures"] == [failure] and bob["failures"] == []
        assert isinstance(root["charts"], int)

        charts = await clients.root.get("/api/fleet/charts")
        assert charts["step"] == 10.0 and charts["seq"] >= root["charts"]
        assert {"completed", "failed", "stopped", "totals"} <= set(charts["throughput"])
        assert {"pending", "peak", "running"} <= set(charts["queue"])
        assert charts["tenants"]["basis"] == "slot-seconds run"
        # A tenant's page: the lanes only (the other charts count every tenant's prompts).
        mine = await clients.alice.get("/api/fleet/charts")
        assert mine["throughput"] is mine["queue"] is mine["tenants"] is None
        assert isinstance(mine["lanes"], list)


async def test_the_websocket_sends_a_snapshot_at_once_then_only_what_changed(
    tmp_path: Path,
) -> None:
    async with (
        serve(tmp_path, local_slots=2) as served,
        served.session.ws_connect(served.url + "/api/fleet/ws") as ws,
    ):
        first = await asyncio.wait_for(ws.receive_json(), 5)
        assert first["queue"]["pending"] == 0
        prompt_id = await served.submit(save_prompt(1, "live"))
        deadline = time.monotonic() + 10
        while True:
            snapshot = await asyncio.wait_for(ws.receive_json(), 5)
            assert time.monotonic() < deadline
            if any(r["id"] == prompt_id for r in snapshot["recent"]):
                break
        assert snapshot["outputs"][0]["filename"].startswith("live")
        # Nothing happens: one snapshot a second at most (wait times, backends).
        quiet = time.monotonic()
        await asyncio.wait_for(ws.receive_json(), 5)
        assert time.monotonic() - quiet > 0.5


async def test_a_running_collectors_slots_and_its_final_report(tmp_path: Path) -> None:
    emulator = await start_emulator(KEY, latency=1.0)
    try:
        prompt = json.loads(EXAMPLE.read_text())
        prompt["1"]["inputs"]["base_url"] = emulator.url
        prompt["1"]["inputs"]["api_key"] = KEY
        async with serve(tmp_path, local_slots=1) as served:
            prompt_id = await served.submit(prompt, "collector")

            async def live_slots() -> bool:
                collectors = (await _status(served))["collectors"]
                return any(c["live"] and c["slots"] for c in collectors)

            await poll(live_slots, what="the collector waiting")
            [live] = [c for c in (await _status(served))["collectors"] if c["live"]]
            assert (live["prompt_id"], live["node"], live["mode"]) == (prompt_id, "4", "fail_fast")
            assert [s["slot"] for s in live["slots"]] == [1, 2]
            assert {s["state"] for s in live["slots"]} <= {"queued", "running", "success"}

            async def reported() -> bool:
                collectors = (await _status(served))["collectors"]
                return any(not c["live"] for c in collectors)

            await poll(reported, what="the collector's report")
            [done] = (await _status(served))["collectors"]
            assert [(s["slot"], s["state"]) for s in done["slots"]] == [
                (1, "success"),
                (2, "success"),
            ]
            assert KEY not in json.dumps(done)  # the key never shows
    finally:
        await emulator.server.close()
