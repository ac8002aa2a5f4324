"""`POST /prompt?wait=SECONDS` (real server, real client): the history entry once the
prompt ends, a 202 with the usual answer when the wait runs out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.server.comfyui_api.waits import WAITS
from tests.integration.gateway.wire import Served, poll, save_prompt, serve, sleep_prompt

FAILING = {
    "1": {"class_type": "Fail", "inputs": {"message": "on purpose"}},
    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
}


async def waiting(served: Served) -> int:
    return served.server.app[WAITS].waiting


async def test_a_prompt_that_ends_in_time_answers_its_history_entry(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        reply = await served.post("/prompt?wait=30", {"prompt": save_prompt(5, "waited")})
        assert reply.status == 200, reply.text
        (prompt_id,) = reply.json
        assert reply.json == await served.get(f"/history/{prompt_id}")
        entry = reply.json[prompt_id]
        assert entry["status"]["status_str"] == "success" and entry["status"]["completed"]
        assert entry["outputs"]["2"]["images"][0]["filename"].startswith("waited_")
        assert await waiting(served) == 0


async def test_a_failing_prompt_answers_its_entry_with_the_error(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        reply = await served.post("/api/prompt?wait=30", {"prompt": FAILING})
        assert reply.status == 200, reply.text
        (prompt_id,) = reply.json
        status = reply.json[prompt_id]["status"]
        assert status["status_str"] == "error" and not status["completed"]
        errors = [data for kind, data in status["messages"] if kind == "execution_error"]
        assert errors[0]["exception_message"].strip() == "on purpose"
        assert errors[0]["node_type"] == "Fail"


async def test_a_wait_that_runs_out_is_a_202_with_the_usual_answer(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        began = time.monotonic()
        reply = await served.post("/prompt?wait=0.5", {"prompt": sleep_prompt(30, 1)})
        assert reply.status == 202, reply.text
        assert time.monotonic() - began >= 0.5
        assert set(reply.json) == {"prompt_id", "number", "node_errors"}
        assert (await served.job(reply.json["prompt_id"]))["status"] in ("pending", "in_progress")
        assert await waiting(served) == 0


async def test_a_prompt_cancelled_while_pending_ends_the_wait(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        await served.submit(sleep_prompt(30, 1))
        body = {"prompt": save_prompt(2, "never"), "prompt_id": "cancel-me"}
        waited = asyncio.create_task(served.post("/prompt?wait=60", body))

        async def queued() -> bool:
            return (await served.request("GET", "/api/jobs/cancel-me")).status == 200

        await poll(queued, what="the prompt to be queued")
        await served.post("/api/jobs/cancel-me/cancel", None)
        reply = await asyncio.wait_for(waited, 15)  # seen by the store poll
        assert (reply.status, reply.json) == (200, {})  # as /history/cancel-me answers


@pytest.mark.parametrize("value", ["", "soon", "-1", "nan", "inf", "600.5", "1e9"])
async def test_bad_waits_are_a_400_and_queue_nothing(tmp_path: Path, value: str) -> None:
    async with serve(tmp_path) as served:
        reply = await served.post(f"/prompt?wait={value}", {"prompt": save_prompt(1, "x")})
        assert reply.status == 400, reply.text
        assert reply.json["error"]["type"] == "invalid_wait"
        assert (await served.get("/api/jobs"))["jobs"] == []


async def test_clients_that_leave_cost_nothing_and_others_are_served(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        await served.submit(sleep_prompt(30, 1))
        url = served.url + "/prompt?wait=600"

        async def leaving(color: int) -> None:
            timeout = aiohttp.ClientTimeout(total=0.5)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                with pytest.raises(asyncio.TimeoutError):
                    await session.post(url, json={"prompt": save_prompt(color, "late")})

        await asyncio.gather(*(leaving(c) for c in range(20)))
        began = time.monotonic()
        assert (await served.get("/prompt"))["exec_info"]["queue_remaining"] == 21
        assert time.monotonic() - began < 5

        async def all_gone() -> bool:
            return await waiting(served) == 0

        await poll(all_gone, timeout=10, what="the waits of the clients that left to end")


async def test_a_repeat_with_a_key_waits_for_the_first_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        body: dict[str, Any] = {"prompt": save_prompt(4, "keyed")}
        headers = {"Idempotency-Key": "wait-and-retry"}
        first = await served.request("POST", "/prompt", body, headers=headers)
        again = await served.request("POST", "/prompt?wait=30", body, headers=headers)
        assert again.status == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert list(again.json) == [first.json["prompt_id"]]
        assert again.json[first.json["prompt_id"]]["status"]["status_str"] == "success"


async def test_the_server_stopping_ends_the_waits(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        await served.submit(sleep_prompt(30, 1))
        waited = asyncio.create_task(
            served.post("/prompt?wait=600", {"prompt": save_prompt(1, "x")})
        )

        async def one_waiting() -> bool:
            return await waiting(served) == 1

        await poll(one_waiting, what="the request to wait")
        served.server.app[WAITS].close()
        reply = await asyncio.wait_for(waited, 10)
        assert reply.status == 202
