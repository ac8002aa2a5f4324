"""Comfy API v2 over raw HTTP: bad input gets v2's envelope and status, never a 500,
and nothing is queued by a refused request."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from tests.integration.api_v2.conftest import ALICE, Served, image_workflow, serve

V2 = "/api/v2"


def assert_error(status: int, body: Any, wanted_status: int, code: str) -> None:
    assert status == wanted_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and body["error"]["message"]


async def queued(served: Served) -> int:
    _, _, jobs = await served.call("GET", "/api/jobs")
    return len(jobs["jobs"])


async def test_bad_bodies_are_400_413_and_422(served: Served) -> None:
    cases: list[tuple[Any, int, str]] = [
        (b"{not json", 400, "invalid_request"),
        (b"[1, 2]", 400, "invalid_request"),
        (b"", 400, "invalid_request"),
        (json.dumps({"workflow": "text"}).encode(), 422, "invalid_workflow"),
        (json.dumps({"workflow": {}}).encode(), 422, "invalid_workflow"),
        (json.dumps({"nothing": 1}).encode(), 422, "invalid_workflow"),
        (
            json.dumps({"workflow": {"nodes": [], "links": [], "last_node_id": 0}}).encode(),
            422,
            "workflow_format_ui",
        ),
        (
            json.dumps({"workflow": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}).encode(),
            422,
            "invalid_workflow",
        ),
        (
            json.dumps({"workflow": image_workflow(), "extra_data": {"other": 1}}).encode(),
            400,
            "invalid_request",
        ),
        (
            json.dumps({"workflow": image_workflow(), "metadata": {"k": 1}}).encode(),
            422,
            "metadata_invalid",
        ),
        (
            json.dumps(
                {"workflow": image_workflow(), "metadata": {str(n): "v" for n in range(17)}}
            ).encode(),
            422,
            "metadata_invalid",
        ),
    ]
    ref = {"__type": "core/ASSET", "info": {"id": "9f8a1c0d-2b3e-4f56-8a7b-1c2d3e4f5a6b"}}
    loader = {"1": {"class_type": "LoadImage", "inputs": {"image": ref}}}
    cases.append((json.dumps({"workflow": loader}).encode(), 422, "missing_asset"))
    for body, status, code in cases:
        got, _, answer = await served.call(
            "POST", f"{V2}/jobs", data=body, headers={"Content-Type": "application/json"}
        )
        assert_error(got, answer, status, code)
    _, _, invalid = await served.call(
        "POST", f"{V2}/jobs", json={"workflow": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}
    )
    assert invalid["error"]["details"]["type"] == "invalid_prompt"
    limit = served.gateway.config.max_prompt_bytes
    huge = io.BytesIO(b'{"workflow": "' + b"x" * limit + b'"}')
    status, _, answer = await served.call(
        "POST", f"{V2}/jobs", data=huge, headers={"Content-Type": "application/json"}
    )
    assert_error(status, answer, 413, "too_large")
    assert await queued(served) == 0


async def test_bad_idempotency_keys_are_400_and_a_refused_submit_leaves_the_key_free(
    served: Served,
) -> None:
    body = {"workflow": image_workflow()}
    for headers in ({"Idempotency-Key": ""}, {"Idempotency-Key": "x" * 256}):
        status, _, answer = await served.call("POST", f"{V2}/jobs", json=body, headers=headers)
        assert_error(status, answer, 400, "invalid_request")
    key = {"Idempotency-Key": "retry-me"}
    bad = {"workflow": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}
    status, _, answer = await served.call("POST", f"{V2}/jobs", json=bad, headers=key)
    assert_error(status, answer, 422, "invalid_workflow")
    status, _, job = await served.call("POST", f"{V2}/jobs", json=body, headers=key)
    assert status == 201 and job["status"] in ("queued", "running", "succeeded")
    assert job["urls"]["self"] == f"{V2}/jobs/{job['id']}"
    status, _, answer = await served.call("POST", f"{V2}/jobs", json=body, headers=key)
    assert_error(status, answer, 422, "idempotency_key_reuse")
    assert answer["error"]["details"] == {"job_id": job["id"]}
    assert await queued(served) == 1


async def test_unknown_ids_are_404_and_bad_queries_400(served: Served) -> None:
    for method, path in [
        ("GET", f"{V2}/jobs/nope"),
        ("GET", f"{V2}/jobs/{'x' * 300}"),
        ("POST", f"{V2}/jobs/nope/cancel"),
        ("GET", f"{V2}/jobs/nope/workflow"),
        ("GET", f"{V2}/jobs/nope/events"),
        ("GET", f"{V2}/assets/nope"),
        ("GET", f"{V2}/assets/nope/content"),
        # A well-formed output id whose job does not exist.
        ("GET", f"{V2}/assets/WyJub3BlIiwib3V0cHV0IiwiIiwiYS5wbmciXQ/content"),
    ]:
        status, _, answer = await served.call(method, path)
        assert_error(status, answer, 404, "not_found")
    for query, code in [
        ("limit=0", "invalid_request"),
        ("limit=many", "invalid_request"),
        ("status=done", "invalid_request"),
        ("status=", "invalid_request"),
        ("status=queued,", "invalid_request"),
        ("cursor=not-a-cursor", "invalid_cursor"),
        ("metadata=x", "invalid_metadata_filter"),
        ("&".join(f"metadata[k{n}]=v" for n in range(17)), "invalid_metadata_filter"),
    ]:
        status, _, answer = await served.call("GET", f"{V2}/jobs?{query}")
        assert_error(status, answer, 400, code)
    status, _, page = await served.call("GET", f"{V2}/jobs?limit=100000")
    assert status == 200 and page == {"jobs": []}


async def test_an_output_id_cannot_reach_a_file_outside_the_folders(served: Served) -> None:
    status, _, job = await served.call("POST", f"{V2}/jobs", json={"workflow": image_workflow()})
    assert status == 201

    def forged(kind: str, subfolder: str, name: str) -> str:
        raw = json.dumps([job["id"], kind, subfolder, name]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    for asset in (
        forged("output", "../..", "etc/passwd"),
        forged("output", "", "../../x"),
        forged("secrets", "", "a.png"),
    ):
        status, _, _ = await served.call("GET", f"{V2}/assets/{asset}/content")
        assert status in (400, 403, 404)


async def test_without_a_token_every_v2_route_is_401_in_the_v2_envelope(tenants: Served) -> None:
    for method, path in [
        ("POST", f"{V2}/jobs"),
        ("GET", f"{V2}/jobs"),
        ("GET", f"{V2}/jobs/x"),
        ("GET", f"{V2}/jobs/x/events"),
        ("GET", f"{V2}/assets/x/content"),
    ]:
        status, headers, answer = await tenants.call(method, path)
        assert_error(status, answer, 401, "unauthorized")
        assert headers["WWW-Authenticate"].startswith("Bearer")
        status, _, answer = await tenants.call(method, path, token=ALICE + "x")
        assert_error(status, answer, 401, "unauthorized")
    status, _, page = await tenants.call("GET", f"{V2}/jobs", token=ALICE)
    assert status == 200 and page == {"jobs": []}


async def test_a_large_workflow_is_taken_and_given_back_whole(served: Served) -> None:
    flow = image_workflow()
    flow["1"]["inputs"]["note"] = "x" * 400_000  # past the size parsed on the loop
    status, _, job = await served.call("POST", f"{V2}/jobs", json={"workflow": flow})
    assert status == 201
    status, _, kept = await served.call("GET", f"{V2}/jobs/{job['id']}/workflow")
    assert status == 200 and kept["format"] == "api"
    assert kept["workflow"]["1"]["inputs"]["note"] == "x" * 400_000


async def test_a_body_past_the_upload_cap_is_413_in_the_v2_envelope(
    tmp_path: Path,
) -> None:
    async for served in serve(tmp_path, max_upload_bytes=1000, max_prompt_bytes=10_000):
        big = json.dumps({"workflow": image_workflow(), "pad": "x" * 2000})
        status, _, answer = await served.call(
            "POST", f"{V2}/jobs", data=big, headers={"Content-Type": "application/json"}
        )
        assert_error(status, answer, 413, "too_large")
        status, _, _ = await served.call(
            "POST", "/prompt", data=big, headers={"Content-Type": "application/json"}
        )
        assert status == 413  # ComfyUI's routes keep their empty 413
