"""`Idempotency-Key` on POST /prompt (real server, real client): a repeat of a request gets
the first answer and queues nothing; the key with another body is a 409; keys are per
tenant. (Expiry after 24 hours: tests/unit/store/test_idempotency_contract.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import Reply, Served, save_prompt, serve, sleep_prompt


async def keyed(served: Served, body: dict[str, Any], key: str, path: str = "/prompt") -> Reply:
    return await served.request("POST", path, body, headers={"Idempotency-Key": key})


async def job_ids(served: Served) -> list[str]:
    listed = await served.get("/api/jobs")
    return [job["id"] for job in listed["jobs"]]


async def test_a_repeated_request_gets_the_first_answer(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        body = {"prompt": sleep_prompt(30, 1), "client_id": "c1"}
        first = await keyed(served, body, "order-42")
        assert first.status == 200, first.text
        assert set(first.json) == {"prompt_id", "number", "node_errors"}
        assert "Idempotent-Replayed" not in first.headers
        again = await keyed(served, body, "order-42", "/api/prompt")  # either spelling
        assert (again.status, again.json) == (200, first.json)
        assert again.headers["Idempotent-Replayed"] == "true"
        # The same body with its keys in another order and other spacing is the same request.
        reordered = {"client_id": "c1", "prompt": sleep_prompt(30, 1)}
        assert (await keyed(served, reordered, "order-42")).json == first.json
        assert await job_ids(served) == [first.json["prompt_id"]]
        # Without the key, or with another, it is a new prompt.
        other = await keyed(served, body, "order-43")
        assert other.json["prompt_id"] != first.json["prompt_id"]
        assert other.json["number"] == first.json["number"] + 1
        assert len(await job_ids(served)) == 2


async def test_concurrent_requests_with_one_key_queue_one_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        body = {"prompt": save_prompt(3, "once")}
        replies = await asyncio.gather(*(keyed(served, body, "retry-storm") for _ in range(16)))
        assert {r.status for r in replies} == {200}
        assert len({r.json["prompt_id"] for r in replies}) == 1
        assert sum("Idempotent-Replayed" not in r.headers for r in replies) == 1
        (prompt_id,) = {r.json["prompt_id"] for r in replies}
        await served.wait_history(prompt_id)
        assert await job_ids(served) == [prompt_id]
        assert len(list(served.gateway.folders.output.glob("once_*"))) == 1


async def test_the_key_with_another_body_is_a_409(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        first = await keyed(served, {"prompt": sleep_prompt(30, 1)}, "k-1")
        assert first.status == 200
        refused = await keyed(served, {"prompt": sleep_prompt(30, 2)}, "k-1")
        assert refused.status == 409
        assert (refused.content_type or "").startswith("application/json")
        assert refused.json["error"]["type"] == "idempotency_key_reused"
        assert set(refused.json) == {"error", "node_errors"}
        assert await job_ids(served) == [first.json["prompt_id"]]


async def test_a_refused_prompt_leaves_its_key_free(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        broken = {"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}
        assert (await keyed(served, broken, "k-2")).status == 400
        fixed = await keyed(served, {"prompt": save_prompt(1, "fixed")}, "k-2")
        assert fixed.status == 200, fixed.text
        duplicate = {"prompt": save_prompt(1, "dup"), "prompt_id": fixed.json["prompt_id"]}
        assert (await keyed(served, duplicate, "k-3")).status == 400  # its prompt_id is taken
        third = await keyed(served, {"prompt": save_prompt(2, "third")}, "k-3")
        assert third.status == 200, third.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Idempotency-Key": ""},
        {"Idempotency-Key": "x" * 256},
        {"Idempotency-Key": "has space"},
        {"Idempotency-Key": "caf\u00e9"},
    ],
    ids=["empty", "too-long", "space", "non-ascii"],
)
async def test_bad_keys_are_a_400(tmp_path: Path, headers: dict[str, str]) -> None:
    async with serve(tmp_path) as served:
        reply = await served.request(
            "POST", "/prompt", {"prompt": save_prompt(1, "x")}, headers=headers
        )
        assert reply.status == 400, reply.text
        assert reply.json["error"]["type"] == "invalid_idempotency_key"
        assert await job_ids(served) == []


async def test_two_key_headers_are_a_400(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        url = served.url + "/prompt"
        headers = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        async with served.session.post(
            url, json={"prompt": save_prompt(1, "x")}, headers=headers
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["type"] == "invalid_idempotency_key"
        longest = await keyed(served, {"prompt": save_prompt(1, "y")}, "x" * 255)
        assert longest.status == 200


async def test_keys_belong_to_one_tenant(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        body = {"prompt": sleep_prompt(30, 1)}
        alice = await keyed(clients.alice, body, "shared-key")
        bob = await keyed(clients.bob, body, "shared-key")
        assert alice.status == bob.status == 200
        assert alice.json["prompt_id"] != bob.json["prompt_id"]
        again = await keyed(clients.bob, body, "shared-key")
        assert again.json == bob.json and again.headers["Idempotent-Replayed"] == "true"
        assert await job_ids(clients.alice) == [alice.json["prompt_id"]]
