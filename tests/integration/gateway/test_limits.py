"""Requests the gateway refuses: a full queue, bodies that are not JSON, bodies too large.

Each refusal is ComfyUI's error shape where ComfyUI has one, and the server keeps serving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.gateway.wire import Served, save_prompt, serve, sleep_prompt


def assert_comfyui_error(body: Any, error_type: str) -> None:
    """`{error: {type, message, details, extra_info}, node_errors}` as ComfyUI's POST /prompt."""
    assert set(body) == {"error", "node_errors"}, body
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}, body
    assert body["error"]["type"] == error_type, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["node_errors"] == {}


async def assert_still_serving(served: Served) -> None:
    sock = await served.connect()
    prompt_id = await served.submit(save_prompt(123, "alive"), sock.client_id)
    await sock.done(prompt_id)
    assert (await served.history_entry(prompt_id))["status"]["completed"] is True


async def test_a_full_queue_answers_429_with_retry_after(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1, max_pending=5) as served:
        sock = await served.connect()
        busy = await served.submit(sleep_prompt(30), sock.client_id)
        await sock.progress(busy, "2")  # the slot is taken: what follows stays pending
        pending = [await served.submit(save_prompt(c, "p"), sock.client_id) for c in range(5)]

        reply = await served.post("/prompt", {"prompt": save_prompt(99, "p"), "client_id": "x"})
        assert reply.status == 429
        assert int(reply.headers["Retry-After"]) >= 1
        assert reply.content_type == "application/json; charset=utf-8"
        assert_comfyui_error(reply.json, "queue_full")
        assert (await served.get("/prompt"))["exec_info"]["queue_remaining"] == 6

        # A pending prompt leaving makes room again.
        assert (await served.post("/queue", {"delete": [pending[0]]})).status == 200
        await served.submit(save_prompt(100, "p"), sock.client_id)


async def test_a_body_that_is_not_json_is_a_400_in_comfyuis_shape(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        for path in ("/prompt", "/queue", "/history", "/interrupt", "/api/jobs/cancel"):
            reply = await served.request("POST", path, data=b'{"prompt": {', headers=JSON)
            assert reply.status == 400, path
            assert reply.content_type == "application/json; charset=utf-8", path
            assert_comfyui_error(reply.json, "invalid_json")
        reply = await served.request("POST", "/prompt", data=b"\xff\xfe", headers=JSON)
        assert reply.status == 400
        reply = await served.post("/prompt", ["a", "list"])
        assert reply.status == 400
        assert_comfyui_error(reply.json, "invalid_prompt")
        await assert_still_serving(served)


JSON = {"Content-Type": "application/json"}


async def test_a_body_over_the_upload_limit_is_refused_with_413(tmp_path: Path) -> None:
    async with serve(tmp_path, max_upload_bytes=4096) as served:
        prompt = save_prompt(1, "x" * 8000)
        body = json.dumps({"prompt": prompt}).encode()
        assert len(body) > 4096
        reply = await served.request("POST", "/prompt", data=body, headers=JSON)
        assert reply.status == 413
        reply = await served.request("POST", "/queue", data=body, headers=JSON)
        assert reply.status == 413
        await assert_still_serving(served)


def wide_prompt(pairs: int) -> dict[str, Any]:
    """`pairs` constants, each shown by its own PreviewAny."""
    prompt: dict[str, Any] = {}
    for k in range(pairs):
        prompt[f"p{k}"] = {"class_type": "PrimitiveInt", "inputs": {"value": k}}
        prompt[f"v{k}"] = {"class_type": "PreviewAny", "inputs": {"source": [f"p{k}", 0]}}
    return prompt


async def test_a_prompt_past_the_node_or_byte_limit_is_a_400_in_comfyuis_shape(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, max_prompt_nodes=100, max_prompt_bytes=64 * 1024) as served:
        reply = await served.post("/prompt", {"prompt": wide_prompt(51)})
        assert reply.status == 400
        assert_comfyui_error(reply.json, "prompt_too_large")
        assert "102 nodes; at most 100" in reply.json["error"]["details"]
        reply = await served.post("/comfyfleet/validate", {"prompt": wide_prompt(51)})
        assert_comfyui_error(reply.json, "prompt_too_large")

        body = json.dumps({"prompt": wide_prompt(1), "extra_data": {"pad": "x" * 70_000}})
        for data in (body.encode(), _chunks(body.encode())):  # with a length, and without
            reply = await served.request("POST", "/prompt", data=data, headers=JSON)
            assert reply.status == 400
            assert_comfyui_error(reply.json, "too_large")

        sock = await served.connect()
        prompt_id = await served.submit(wide_prompt(50), sock.client_id)  # at the limit
        await sock.done(prompt_id)
        assert (await served.history_entry(prompt_id))["status"]["completed"] is True


async def _chunks(body: bytes) -> Any:
    for start in range(0, len(body), 8192):  # no Content-Length: sent chunked
        yield body[start : start + 8192]
