"""Interrupts hit exactly what they name; a client that reconnects is brought up to date."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.gateway.wire import Socket, serve, sleep_prompt


def final_event(sock: Socket, prompt_id: str) -> str:
    """execution_success / _error / _interrupted: the event before the done signal's status."""
    ends = ("execution_success", "execution_error", "execution_interrupted")
    found = [t for t in sock.json_types(prompt_id) if t in ends]
    assert len(found) == 1, found
    return found[0]


async def test_a_reconnecting_client_gets_the_running_prompts_state_after_status(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=2) as served:
        first = await served.connect("phone")
        prompt_id = await served.submit(sleep_prompt(30), "phone")
        await first.progress(prompt_id, "2")
        await first.close()

        again = await served.connect("phone")
        await again.wait_for(lambda f: f.type == "progress_state", what="the catch-up")
        greeting, executing, state = again.frames[:3]
        assert greeting.type == "status"
        assert greeting.data == {"status": {"exec_info": {"queue_remaining": 1}}, "sid": "phone"}
        assert executing.type == "executing"
        assert executing.data == {"node": "2", "display_node": "2", "prompt_id": prompt_id}
        assert state.data["prompt_id"] == prompt_id
        assert {n: e["state"] for n, e in state.data["nodes"].items()} == {
            "1": "finished",
            "2": "running",
        }

        # The prompt's own events now reach the new socket, up to its done signal.
        await again.progress(prompt_id, "2", after=3)
        assert (await served.post("/interrupt", {"prompt_id": prompt_id})).status == 200
        await again.done(prompt_id)
        assert final_event(again, prompt_id) == "execution_interrupted"


async def test_a_new_client_id_gets_no_catch_up(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        owner = await served.connect("owner")
        prompt_id = await served.submit(sleep_prompt(30), "owner")
        await owner.progress(prompt_id, "2")
        stranger = await served.connect("stranger")
        await served.post("/interrupt", {"prompt_id": prompt_id})
        await owner.done(prompt_id)
        await stranger.wait_until(
            lambda frames: (
                frames[-1].type == "status"
                and frames[-1].data["status"]["exec_info"]["queue_remaining"] == 0
            ),
            what="the queue emptied",
        )
        assert {f.type for f in stranger.frames} == {"status"}


async def test_interrupt_with_a_prompt_id_stops_only_that_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=4) as served:
        sock = await served.connect()
        ids = [await served.submit(sleep_prompt(1.0, color), sock.client_id) for color in range(3)]
        for prompt_id in ids:
            await sock.progress(prompt_id, "2")  # all three are running

        reply = await served.post("/interrupt", {"prompt_id": ids[1]})
        assert (reply.status, reply.content_type, reply.text) == (200, None, "")
        await asyncio.gather(*(sock.done(prompt_id) for prompt_id in ids))

        assert [final_event(sock, p) for p in ids] == [
            "execution_success",
            "execution_interrupted",
            "execution_success",
        ]
        stopped = await served.history_entry(ids[1])
        assert stopped["status"]["status_str"] == "error"
        assert stopped["status"]["messages"][-1][0] == "execution_interrupted"
        assert stopped["status"]["messages"][-1][1]["node_id"] == "2"
        for prompt_id in (ids[0], ids[2]):
            entry = await served.history_entry(prompt_id)
            assert entry["status"]["completed"] is True
        assert (await served.job(ids[1]))["status"] == "interrupted"


async def test_interrupt_without_an_id_stops_every_running_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=3) as served:
        sock = await served.connect()
        running = [await served.submit(sleep_prompt(30, c), sock.client_id) for c in range(3)]
        waiting = await served.submit(sleep_prompt(0.1, 99), sock.client_id)
        for prompt_id in running:
            await sock.progress(prompt_id, "2")
        assert (await served.job(waiting))["status"] == "pending"

        reply = await served.request("POST", "/interrupt")  # no body at all
        assert (reply.status, reply.content_type, reply.text) == (200, None, "")
        await asyncio.gather(*(sock.done(prompt_id) for prompt_id in [*running, waiting]))

        assert [final_event(sock, p) for p in running] == ["execution_interrupted"] * 3
        # A prompt that was still pending is not running, so not interrupted: it runs next.
        assert final_event(sock, waiting) == "execution_success"


async def test_interrupting_an_unknown_or_finished_prompt_changes_nothing(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        done = await served.submit(sleep_prompt(0, 1), sock.client_id)
        await sock.done(done)
        running = await served.submit(sleep_prompt(1.0, 2), sock.client_id)
        await sock.progress(running, "2")
        for name in (done, "no-such-prompt"):
            reply = await served.post("/interrupt", {"prompt_id": name})
            assert (reply.status, reply.text) == (200, "")
        await sock.done(running)
        assert final_event(sock, running) == "execution_success"
        assert (await served.history_entry(done))["status"]["completed"] is True
