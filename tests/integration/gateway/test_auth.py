"""Authentication on: every route and the WebSocket need a token, and each tenant sees and
touches only its own jobs, history, files and events (real server, real clients)."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from comfyfleet.server.config import AuthToken
from tests.integration.gateway.wire import (
    Served,
    poll,
    save_prompt,
    serve,
    sleep_prompt,
)
from tests.integration.server.test_openapi import documented_operations, load_spec

ALICE = "alice-token-4f1d8a2b9c"
BOB = "bob-token-7e3c5a1f0d"
ROOT = "root-token-2b8e6d4a1c"  # the default tenant, admin
TOKENS = (
    AuthToken(ALICE, "alice"),
    AuthToken(BOB, "bob"),
    AuthToken(ROOT, "default", admin=True),
)


@dataclass
class Clients:
    anonymous: Served  # no token
    alice: Served
    bob: Served
    root: Served


def as_tenant(served: Served, token: str) -> Served:
    session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
    return replace(served, session=session, sockets=[])


@asynccontextmanager
async def tenants(tmp_path: Path, **settings: Any) -> AsyncIterator[Clients]:
    settings.setdefault("local_slots", 2)
    async with serve(tmp_path, auth_tokens=TOKENS, **settings) as served:
        clients = Clients(
            served, as_tenant(served, ALICE), as_tenant(served, BOB), as_tenant(served, ROOT)
        )
        try:
            yield clients
        finally:
            for client in (clients.alice, clients.bob, clients.root):
                for sock in client.sockets:
                    await sock.close()
                await client.session.close()


def assert_unauthorized(status: int, headers: Any, body: Any) -> None:
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert body["node_errors"] == {}
    assert body["error"]["type"] == "unauthorized"
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}


#: The login page's routes need no token; the pages send a browser without one there.
LOGIN = {("GET", "/login"), ("POST", "/login"), ("POST", "/logout")}
PAGES = {("GET", "/"), ("GET", "/fleet")}
#: Probes for load balancers: yes or no and why, nothing else, no token.
PROBES = {("GET", "/healthz"), ("GET", "/readyz")}
#: Routes between the gateways of one store: no user token, the fleet's signature instead.
INTERNAL = {("GET", "/comfyfleet/peer/file"), ("POST", "/comfyfleet/peer/cancel")}


def registered_routes(served: Served) -> list[tuple[str, str]]:
    """Every (method, path) the server registers, path parameters filled in."""
    found = []
    for route in served.server.app.router.routes():
        if route.resource is None or route.method == "HEAD":
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.resource.canonical)
        found.append((route.method, path))
    return found


async def test_every_route_and_the_websocket_need_a_token(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        anonymous = clients.anonymous
        routes = registered_routes(anonymous)
        assert len(routes) >= 40  # ComfyUI's routes, their /api twins, jobs and fleet
        for method, path in [*routes, ("GET", "/no/such/route")]:
            if (method, path) in LOGIN:
                continue
            if (method, path) in PROBES:
                reply = await anonymous.request(method, path, {})
                assert reply.status == 200 and set(reply.json) == {"status"}
                continue
            if (method, path) in INTERNAL:  # refused without the fleet's signature
                assert (await anonymous.request(method, path, {})).status == 403
                continue
            if (method, path) in PAGES:  # a browser is sent to the login page instead
                url = anonymous.url + path
                async with anonymous.session.get(url, allow_redirects=False) as page:
                    assert page.status == 302 and page.headers["Location"].startswith("/login")
                continue
            reply = await anonymous.request(method, path, {})
            if path.startswith("/api/v2/"):  # Comfy API v2 answers in its own envelope
                assert reply.status == 401 and reply.headers["WWW-Authenticate"]
                assert set(reply.json) == {"error"}
                assert set(reply.json["error"]) == {"code", "message", "details"}
                assert reply.json["error"]["code"] == "unauthorized"
                continue
            assert_unauthorized(reply.status, reply.headers, reply.json)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await anonymous.session.ws_connect(f"{anonymous.url}/ws?clientId=c1")
        assert refused.value.status == 401
        assert anonymous.gateway.hub.count() == 0
        # Nothing was queued, deleted or interrupted by any of that.
        assert (await clients.root.get("/api/jobs"))["jobs"] == []


async def test_wrong_tokens_are_refused(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        served = clients.anonymous
        for headers, query in [
            ({"Authorization": "Bearer not-a-token"}, ""),
            ({"Authorization": f"Bearer {ALICE}x"}, ""),
            ({"Authorization": f"Basic {ALICE}"}, ""),
            ({"Authorization": "Bearer "}, ""),
            ({}, "?token=not-a-token"),
            ({}, f"?token={ALICE[:-1]}"),
        ]:
            reply = await served.request("GET", "/queue" + query, headers=headers)
            assert_unauthorized(reply.status, reply.headers, reply.json)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await served.session.ws_connect(f"{served.url}/ws?clientId=c1&token=wrong")
        assert refused.value.status == 401


async def test_a_token_goes_in_the_header_or_the_query(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        served = clients.anonymous
        for scheme, path in (("Bearer", "/queue"), ("bearer", "/api/queue")):
            headers = {"Authorization": f"{scheme} {BOB}"}
            assert (await served.request("GET", path, headers=headers)).status == 200
        by_query = await served.request("GET", f"/queue?token={BOB}")
        assert by_query.status == 200
        ws = await served.session.ws_connect(f"{served.url}/ws?clientId=q1&token={BOB}")
        greeting = await ws.receive_json(timeout=10)
        assert greeting["type"] == "status" and greeting["data"]["sid"] == "q1"
        await ws.close()


async def test_each_tenant_sees_only_its_own_queue_history_and_jobs(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=1) as clients:
        alice, bob = clients.alice, clients.bob
        alice_sock, bob_sock = await alice.connect(), await bob.connect()
        done_a = await alice.submit(save_prompt(1, "alice"), alice_sock.client_id)
        done_b = await bob.submit(save_prompt(2, "bob"), bob_sock.client_id)
        await alice_sock.done(done_a)
        await bob_sock.done(done_b)
        running_a = await alice.submit(sleep_prompt(30, 3), alice_sock.client_id)
        await alice_sock.progress(running_a, "2")
        pending_b = await bob.submit(save_prompt(4, "bob-later"), bob_sock.client_id)

        queue_a, queue_b = await alice.get("/queue"), await bob.get("/api/queue")
        assert [i[1] for i in queue_a["queue_running"]] == [running_a]
        assert queue_a["queue_pending"] == []
        assert queue_b["queue_running"] == []
        assert [i[1] for i in queue_b["queue_pending"]] == [pending_b]
        assert (await alice.get("/prompt"))["exec_info"]["queue_remaining"] == 1
        assert (await bob.get("/api/prompt"))["exec_info"]["queue_remaining"] == 1
        assert (await clients.root.get("/prompt"))["exec_info"]["queue_remaining"] == 0

        assert list(await alice.get("/history")) == [done_a]
        assert list(await bob.get("/history?max_items=5")) == [done_b]
        assert await bob.get(f"/history/{done_a}") == {}  # as for an unknown id
        assert await alice.get(f"/api/history/{done_b}") == {}
        assert (await alice.history_entry(done_a))["status"]["completed"] is True

        jobs_a = await alice.get("/api/jobs")
        assert {j["id"] for j in jobs_a["jobs"]} == {done_a, running_a}
        assert jobs_a["pagination"]["total"] == 2
        jobs_b = await bob.get("/api/jobs?status=pending")
        assert [j["id"] for j in jobs_b["jobs"]] == [pending_b]
        assert (await bob.request("GET", f"/api/jobs/{running_a}")).status == 404
        assert (await alice.request("GET", f"/api/jobs/{done_b}")).status == 404
        assert (await clients.root.get("/api/jobs"))["jobs"] == []  # admin is a tenant too

        # A prompt id that is taken by another tenant says nothing about that job.
        reply = await bob.post("/prompt", {"prompt": save_prompt(5, "x"), "prompt_id": done_a})
        assert reply.status == 400
        assert reply.json["error"]["type"] == "duplicate_prompt_id"
        assert "alice" not in reply.text and '"prompt":' not in reply.text


async def test_a_tenant_cannot_stop_delete_or_clear_another_tenants_jobs(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=1) as clients:
        alice, bob = clients.alice, clients.bob
        sock = await alice.connect()
        finished = await alice.submit(save_prompt(1, "kept"), sock.client_id)
        await sock.done(finished)
        running = await alice.submit(sleep_prompt(1.5, 2), sock.client_id)
        await sock.progress(running, "2")
        pending = await alice.submit(save_prompt(3, "waiting"), sock.client_id)

        for path, body in [
            ("/interrupt", {"prompt_id": running}),
            ("/api/interrupt", {}),
            ("/queue", {"delete": [pending, running]}),
            ("/queue", {"clear": True}),
            ("/history", {"delete": [finished]}),
            ("/api/history", {"clear": True}),
        ]:
            reply = await bob.post(path, body)
            assert reply.status == 200, (path, reply.text)
        for job_id in (running, pending):
            reply = await bob.post(f"/api/jobs/{job_id}/cancel", {})
            assert reply.status == 404
        reply = await bob.post("/api/jobs/cancel", {"job_ids": [running, pending, finished]})
        assert reply.json == {"cancelled": []}

        # Untouched: the running prompt ends well, the pending one runs after it.
        await sock.done(running)
        await sock.done(pending)
        assert "execution_success" in sock.json_types(running)
        assert "execution_interrupted" not in sock.json_types(running)
        assert set(await alice.get("/history")) == {finished, running, pending}

        # Alice can do each of these to her own jobs.
        await alice.post("/history", {"delete": [finished]})
        assert set(await alice.get("/history")) == {running, pending}
        await alice.post("/history", {"clear": True})
        assert await alice.get("/history") == {}
        long = await alice.submit(sleep_prompt(30, 4), sock.client_id)
        await sock.progress(long, "2")
        assert (await alice.post("/interrupt", {})).status == 200
        await sock.done(long)
        assert "execution_interrupted" in sock.json_types(long)


async def test_a_tenants_interrupt_leaves_other_tenants_running(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=2) as clients:
        alice, bob = clients.alice, clients.bob
        sock_a, sock_b = await alice.connect(), await bob.connect()
        mine = await bob.submit(sleep_prompt(30, 1), sock_b.client_id)
        theirs = await alice.submit(sleep_prompt(1.5, 2), sock_a.client_id)
        await sock_b.progress(mine, "2")
        await sock_a.progress(theirs, "2")
        assert (await bob.post("/interrupt", {})).status == 200  # no prompt_id: all of bob's
        await sock_b.done(mine)
        assert "execution_interrupted" in sock_b.json_types(mine)
        await sock_a.done(theirs)
        assert "execution_success" in sock_a.json_types(theirs)


async def test_events_go_only_to_the_tenant_of_the_client_id(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=1) as clients:
        alice, bob = clients.alice, clients.bob
        shared = "same-client-id"
        sock_a = await alice.connect(shared)
        sock_b = await bob.connect(shared, preview_metadata=True)
        # The default tenant naming alice's key as its client id reaches nothing either.
        sock_root = await clients.root.connect(f"alice%00{shared}")
        assert sock_root.frames[0].data["sid"] == f"alice\x00{shared}"
        quick = await alice.submit(save_prompt(1, "a"), shared)
        await sock_a.done(quick)
        slow = await alice.submit(sleep_prompt(30, 2, node="TestSleep"), shared)
        await sock_a.progress(slow, "2")

        # Bob, reconnecting under alice's client id while her prompt runs, gets no catch-up.
        late_b = await bob.connect(shared)
        late_a = await alice.connect(shared)
        await late_a.wait_for(
            lambda f: f.type == "progress_state" and f.prompt_id == slow, what="alice's catch-up"
        )
        bob_own = await bob.submit(save_prompt(3, "b"), shared)
        assert (await alice.post("/interrupt", {"prompt_id": slow})).status == 200
        await sock_a.done(slow)
        await sock_b.done(bob_own)
        await late_b.done(bob_own)
        for sock in (sock_b, late_b):
            seen = {f.prompt_id for f in sock.frames} - {None}
            assert seen == {bob_own}, [f.describe() for f in sock.frames]
        assert {f.prompt_id for f in sock_root.frames} == {None}  # status frames only
        assert {f.prompt_id for f in sock_a.frames} - {None} == {quick, slow}


async def view_status(client: Served, path: str) -> int:
    """The status of a GET whose body may be binary (an image)."""
    async with client.session.get(client.url + path) as response:
        await response.read()
        return response.status


def png_bytes(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format="PNG")
    return out.getvalue()


async def upload(client: Served, name: str, data: bytes, subfolder: str = "") -> dict[str, Any]:
    form = aiohttp.FormData()
    form.add_field("image", data, filename=name, content_type="image/png")
    if subfolder:
        form.add_field("subfolder", subfolder)
    async with client.session.post(f"{client.url}/upload/image", data=form) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


def load_and_save(image: str, prefix: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


async def test_files_are_kept_per_tenant(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        alice, bob, root = clients.alice, clients.bob, clients.root
        data_dir = alice.data_dir
        sock_a, sock_b = await alice.connect(), await bob.connect()

        # The same prompt for two tenants: each gets its own file, none from the other's cache.
        same = save_prompt(9, "same")
        first = await alice.submit(same, sock_a.client_id)
        await sock_a.done(first)
        second = await bob.submit(same, sock_b.client_id)
        await sock_b.done(second)
        [image_a] = (await alice.history_entry(first))["outputs"]["2"]["images"]
        [image_b] = (await bob.history_entry(second))["outputs"]["2"]["images"]
        [cached] = [f for f in sock_b.frames if f.type == "execution_cached"]
        assert cached.data["nodes"] == []
        assert (data_dir / "tenants" / "alice" / "output" / image_a["filename"]).is_file()
        assert (data_dir / "tenants" / "bob" / "output" / image_b["filename"]).is_file()
        assert not list((data_dir / "output").iterdir())  # the default tenant's: untouched

        private = await alice.submit(save_prompt(8, "private"), sock_a.client_id)
        await sock_a.done(private)
        [image_a] = (await alice.history_entry(private))["outputs"]["2"]["images"]
        view_a = f"/view?filename={image_a['filename']}&type=output"
        assert await view_status(alice, view_a) == 200
        assert await view_status(clients.anonymous, view_a + f"&token={ALICE}") == 200
        assert await view_status(bob, view_a) == 404
        assert await view_status(root, view_a) == 404
        escape = f"/view?filename={image_a['filename']}&subfolder=../../alice/output"
        assert await view_status(bob, escape) == 403

        # Uploads land in the uploader's input folder, and only its prompts can load them.
        stored = await upload(bob, "in.png", png_bytes((10, 200, 30)))
        assert stored == {"name": "in.png", "subfolder": "", "type": "input"}
        assert (data_dir / "tenants" / "bob" / "input" / "in.png").is_file()
        assert not (data_dir / "input" / "in.png").exists()
        view_in = "/view?filename=in.png&type=input"
        assert await view_status(bob, view_in) == 200
        assert await view_status(alice, view_in) == 404
        options_b = (await bob.get("/object_info/LoadImage"))["LoadImage"]["input"]["required"]
        options_a = (await alice.get("/object_info"))["LoadImage"]["input"]["required"]
        assert options_b["image"][0] == ["in.png"] and options_a["image"][0] == []

        refused = await alice.post("/prompt", {"prompt": load_and_save("in.png", "steal")})
        assert refused.status == 400, refused.text
        loaded = await bob.submit(load_and_save("in.png", "loaded"), sock_b.client_id)
        await sock_b.done(loaded)
        [image] = (await bob.history_entry(loaded))["outputs"]["2"]["images"]
        with Image.open(data_dir / "tenants" / "bob" / "output" / image["filename"]) as saved:
            assert saved.convert("RGB").getpixel((0, 0)) == (10, 200, 30)


async def test_retention_deletes_each_tenants_files(tmp_path: Path) -> None:
    async with tenants(tmp_path, history_max_entries=1) as clients:
        alice, bob = clients.alice, clients.bob
        sock_a, sock_b = await alice.connect(), await bob.connect()
        old = await alice.submit(save_prompt(1, "old"), sock_a.client_id)
        await sock_a.done(old)
        [image] = (await alice.history_entry(old))["outputs"]["2"]["images"]
        path = alice.data_dir / "tenants" / "alice" / "output" / image["filename"]
        assert path.is_file()
        newer = await bob.submit(save_prompt(2, "newer"), sock_b.client_id)
        await sock_b.done(newer)
        assert await alice.gateway.prune_once() == 1
        assert not path.exists()
        assert await alice.get("/history") == {}


async def test_admin_routes_need_an_admin_token(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        alice, root = clients.alice, clients.root
        for method, path in [
            ("GET", "/api/fleet/backends"),
            ("POST", "/api/fleet/backends"),
            ("POST", "/api/fleet/backends/x/drain"),
            ("POST", "/api/fleet/backends/x/resume"),
            ("DELETE", "/api/fleet/backends/x"),
            ("POST", "/free"),
            ("POST", "/api/free"),
        ]:
            reply = await alice.request(method, path, {})
            assert reply.status == 403, (method, path)
            assert reply.json["error"]["type"] == "forbidden"
            assert set(reply.json["error"]) == {"type", "message", "details", "extra_info"}
        assert (await root.get("/api/fleet/backends")) == {"backends": []}
        assert (await root.post("/free", {"free_memory": True})).status == 200
        for path in ["/object_info", "/system_stats", "/features", "/embeddings", "/models"]:
            assert (await alice.request("GET", path)).status == 200, path
            assert (await alice.request("GET", "/api" + path)).status == 200, path
        assert "/extensions/comfyfleet/fleet.js" in await alice.get("/extensions")


async def test_cors_preflight_needs_no_token_and_refusals_carry_cors_headers(
    tmp_path: Path,
) -> None:
    app = "https://app.example"
    async with tenants(tmp_path, cors_origins=(app,)) as clients:
        served = clients.anonymous
        preflight = await served.request(
            "OPTIONS",
            "/prompt",
            headers={"Origin": app, "Access-Control-Request-Headers": "authorization"},
        )
        assert preflight.status == 200
        assert preflight.headers["Access-Control-Allow-Origin"] == app
        assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
        refused = await served.request("GET", "/queue", headers={"Origin": app})
        assert refused.status == 401
        assert refused.headers["Access-Control-Allow-Origin"] == app
        allowed = await served.request(
            "GET", "/queue", headers={"Origin": app, "Authorization": f"Bearer {ALICE}"}
        )
        assert allowed.status == 200


async def test_auth_off_keeps_one_tenant_and_the_data_dir_layout(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        prompt_id = await served.submit(save_prompt(1, "plain"), sock.client_id)
        await sock.done(prompt_id)
        [image] = (await served.history_entry(prompt_id))["outputs"]["2"]["images"]
        assert (tmp_path / "output" / image["filename"]).is_file()
        assert not (tmp_path / "tenants").exists()
        job = await served.gateway.store.get(prompt_id)
        assert job is not None and job.tenant == "default"


async def test_tokens_are_not_written_to_the_store(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        anonymous = clients.anonymous
        ws = await anonymous.session.ws_connect(f"{anonymous.url}/ws?clientId=t1&token={ALICE}")
        body = {"prompt": save_prompt(1, "t"), "client_id": "t1", "extra_data": {"x": 1}}
        reply = await anonymous.post(f"/prompt?token={ALICE}", body)
        assert reply.status == 200
        prompt_id = reply.json["prompt_id"]

        async def finished() -> bool:
            return bool(await clients.alice.history_entry(prompt_id))

        await poll(finished, what="the prompt's history entry")
        await ws.close()
        await asyncio.sleep(0)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "comfyfleet.db" for p in files)
    for path in files:
        data = path.read_bytes()
        for token in (ALICE, BOB, ROOT):
            assert token.encode() not in data, path


async def test_openapi_documents_authentication(tmp_path: Path) -> None:
    spec = load_spec()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearerToken"]["scheme"] == "bearer"
    assert (schemes["queryToken"]["in"], schemes["queryToken"]["name"]) == ("query", "token")
    async with tenants(tmp_path) as clients:
        # Admin routes are those a valid non-admin token gets 403 from.
        admin = set()
        for route in clients.alice.server.app.router.routes():
            if route.resource is None or route.method == "HEAD":
                continue
            path = re.sub(r"\{[^}]+\}", "x", route.resource.canonical)
            if (route.method, path) in INTERNAL:
                continue
            if (await clients.alice.request(route.method, path, {})).status == 403:
                admin.add((route.method, route.resource.canonical))
    # The fleet admin API (backends, gateways, tenants, workers, demand), /free with its
    # /api twin, the server's logs, the webhook outbox and /metrics.
    assert len(admin) == 18
    for (method, path), operation in documented_operations(spec).items():
        responses = operation["responses"]
        if operation.get("security") == []:  # the login page's routes need no token
            assert "401" not in responses and (method, path) in LOGIN | PROBES, path
            continue
        assert responses["401"] == {"$ref": "#/components/responses/Unauthorized"}, path
        forbidden = responses.get("403") == {"$ref": "#/components/responses/Forbidden"}
        assert forbidden == ((method, path) in admin), (method, path)
