"""A tenant's cap on waiting prompts (`[tenants.NAME] max_queued`) through HTTP: past it,
POST /prompt and the Comfy API v2 submit answer 429 with Retry-After, naming the cap and
nothing of other tenants; other tenants, and the tenant itself once a place frees, go on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from comfyfleet.scheduler.admission import TENANT_RETRY_AFTER
from comfyfleet.shares.policy import SharePolicy, TenantPolicy
from tests.integration.gateway.test_auth import ALICE, ROOT, TOKENS, Clients, as_tenant, tenants
from tests.integration.gateway.test_limits import assert_comfyui_error
from tests.integration.gateway.wire import Reply, Served, poll, save_prompt, serve, sleep_prompt

CAPS = SharePolicy({"alice": TenantPolicy(max_queued=2)})
DETAILS = (
    "this tenant may have at most 2 prompts waiting to run (max_queued); "
    "try again once some have started"
)


async def occupy_the_slot(clients: Clients) -> str:
    """A long prompt of root's on the only slot: what follows waits."""
    return await occupy(clients.root)


async def occupy(root: Served) -> str:
    """A long prompt of root's on the gateway's only slot (and its own: a gateway on a
    shared store runs only what it claims)."""
    sock = await root.connect()
    busy = await root.submit(sleep_prompt(600), sock.client_id)
    await sock.progress(busy, "2")
    return busy


def assert_capped(reply: Reply) -> None:
    assert reply.status == 429, reply.text
    assert reply.headers["Retry-After"] == str(round(TENANT_RETRY_AFTER)) == "5"
    assert reply.content_type == "application/json; charset=utf-8"
    assert_comfyui_error(reply.json, "queue_full")
    assert reply.json["error"]["message"] == "Too many of this tenant's prompts are pending"
    assert reply.json["error"]["details"] == DETAILS
    assert reply.json["error"]["extra_info"] == {}


async def test_a_submit_past_the_tenants_cap_is_a_429_and_others_go_on(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=1, shares=CAPS) as clients:
        await occupy_the_slot(clients)
        # Bob has no cap, and his waiting prompts do not count against alice's.
        for color in range(3):
            await clients.bob.submit(save_prompt(color, "bob"))
        first = await clients.alice.submit(save_prompt(10, "alice"))
        await clients.alice.submit(save_prompt(11, "alice"))

        refused = await clients.alice.post("/prompt", {"prompt": save_prompt(12, "alice")})
        assert_capped(refused)
        assert "bob" not in refused.text and "default" not in refused.text
        assert (await clients.alice.get("/prompt"))["exec_info"]["queue_remaining"] == 2

        # The Comfy API v2 submit: its own envelope, the same status, Retry-After and text.
        v2 = await clients.alice.post("/api/v2/jobs", {"workflow": save_prompt(13, "alice")})
        assert v2.status == 429, v2.text
        assert v2.headers["Retry-After"] == "5"
        assert v2.json["error"]["code"] == "queue_full"
        assert v2.json["error"]["message"] == "Too many of this tenant's prompts are pending"

        await clients.bob.submit(save_prompt(4, "bob"))  # bob is not refused
        # A place frees when one of alice's prompts leaves the queue.
        assert (await clients.alice.post("/queue", {"delete": [first]})).status == 200
        await clients.alice.submit(save_prompt(14, "alice"))
        assert_capped(await clients.alice.post("/prompt", {"prompt": save_prompt(15, "alice")}))


async def test_concurrent_submits_past_the_cap_admit_exactly_the_cap(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=1, shares=CAPS) as clients:
        await occupy_the_slot(clients)
        replies = await asyncio.gather(
            *(clients.alice.post("/prompt", {"prompt": save_prompt(c, "alice")}) for c in range(40))
        )
        assert sorted(r.status for r in replies) == [200] * 2 + [429] * 38
        for reply in replies:
            if reply.status == 429:
                assert_capped(reply)


async def test_a_cap_of_zero_still_runs_a_prompt_a_free_slot_takes_at_once(
    tmp_path: Path,
) -> None:
    """A prompt handed straight to an idle slot runs: it never waits, so the cap allows
    it; once the slot is busy, the same tenant's next prompt would wait: refused."""
    shares = SharePolicy({"alice": TenantPolicy(max_queued=0)})
    async with tenants(tmp_path, local_slots=1, shares=shares) as clients:
        gateway = clients.alice.gateway

        async def parked() -> bool:
            return gateway.scheduler.waiting_slots == 1

        await poll(parked, what="the slot to wait for work")
        sock = await clients.alice.connect()
        running = await clients.alice.submit(sleep_prompt(30), sock.client_id)
        await sock.progress(running, "2")
        reply = await clients.alice.post("/prompt", {"prompt": save_prompt(1, "alice")})
        assert reply.status == 429, reply.text
        assert reply.json["error"]["details"].startswith("this tenant may have at most 0 ")


@pytest.mark.timeout(120)
async def test_the_cap_holds_across_gateways_sharing_a_store(
    tmp_path: Path, postgres_database: str
) -> None:
    """Two gateways on one PostgreSQL, both slots busy: 40 submits of alice at once, half
    through each, admit exactly her cap between them."""
    settings = {"local_slots": 1, "store": postgres_database, "auth_tokens": TOKENS}
    async with (
        serve(tmp_path / "a", shares=CAPS, **settings) as a,
        serve(tmp_path / "b", shares=CAPS, **settings) as b,
    ):
        sessions = [as_tenant(g, token) for g in (a, b) for token in (ROOT, ALICE)]
        root_a, alice_a, root_b, alice_b = sessions
        try:
            await occupy(root_a)
            await occupy(root_b)
            replies = await asyncio.gather(
                *(
                    (alice_a if c % 2 else alice_b).post(
                        "/prompt", {"prompt": save_prompt(c, "alice")}
                    )
                    for c in range(40)
                )
            )
            assert sorted(r.status for r in replies) == [200] * 2 + [429] * 38
            for reply in replies:
                if reply.status == 429:
                    assert_capped(reply)
            assert (await alice_b.get("/prompt"))["exec_info"]["queue_remaining"] == 2
        finally:
            for session in sessions:
                for sock in session.sockets:
                    await sock.close()
                await session.session.close()
