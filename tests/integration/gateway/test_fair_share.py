"""Tenants share the slots (shares/picking.py): one tenant's backlog does not make
another wait behind it, weights split the slot-time, and a tenant at its cap on running
jobs leaves its slots to others (real server, real clients, two tenants' tokens)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.shares.policy import SharePolicy, TenantPolicy
from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import Served, poll, sleep_prompt

SLOTS = 8


async def submit_many(client: Served, count: int, seconds: float) -> list[str]:
    async def one(n: int) -> str:
        answer = await client.request("POST", "/prompt", {"prompt": sleep_prompt(seconds, n)})
        assert answer.status == 200, answer.json
        return str(answer.json["prompt_id"])

    ids: list[str] = []
    for start in range(0, count, 50):
        ids += await asyncio.gather(*(one(n) for n in range(start, min(count, start + 50))))
    return ids


async def jobs_of(client: Served, ids: list[str]) -> list[dict[str, Any]]:
    return [await client.job(p) for p in ids]


async def test_one_tenants_backlog_does_not_hold_up_another(tmp_path: Path) -> None:
    """Alice queues 400 prompts of 0.2 s (10 s of work on 8 slots); Bob's 10, sent
    after, start at once and end long before her backlog does (ComfyUI's one queue,
    and comfyfleet's before fair share, ran his after all of hers)."""
    async with tenants(tmp_path, local_slots=SLOTS) as clients:
        alice = await submit_many(clients.alice, 400, 0.2)
        await asyncio.sleep(0.5)
        sent = time.time()
        bob = await submit_many(clients.bob, 10, 0.2)

        async def bob_done() -> bool:
            return all(j["status"] == "completed" for j in await jobs_of(clients.bob, bob))

        await poll(bob_done, timeout=30, what="Bob's prompts to end", every=0.1)
        ended = time.time()
        starts = [j["execution_start_time"] / 1000 for j in await jobs_of(clients.bob, bob)]
        assert min(starts) - sent < 1.0, min(starts) - sent
        # Alone, 10 prompts of 0.2 s take 0.4 s on 8 slots; sharing with Alice at most
        # about twice that, well under what waiting behind her would take.
        assert ended - sent < 3.0, ended - sent
        still = [j for j in await jobs_of(clients.alice, alice) if j["status"] == "pending"]
        assert len(still) > 200  # her backlog was far from done


@pytest.mark.parametrize("enabled", [True, False], ids=["fair_share_on", "fair_share_off"])
async def test_with_fair_share_off_a_later_tenant_waits_behind_the_backlog(
    tmp_path: Path, enabled: bool
) -> None:
    """Alice queues 8 prompts of 0.25 s on 2 slots (about 1 s of work), then Bob 2.
    Fair share on: Bob's start while hers still wait. Off: one queue order, ComfyUI's
    (by number), so every one of hers starts before any of his."""
    policy = SharePolicy(enabled=enabled)
    async with tenants(tmp_path, local_slots=2, shares=policy) as clients:
        alice = await submit_many(clients.alice, 8, 0.25)
        await asyncio.sleep(0.3)  # her first two are running, the rest wait
        bob = await submit_many(clients.bob, 2, 0.25)

        async def all_done() -> bool:
            jobs = await jobs_of(clients.alice, alice) + await jobs_of(clients.bob, bob)
            return all(j["status"] == "completed" for j in jobs)

        await poll(all_done, timeout=20, what="every prompt to end", every=0.05)
        alice_starts = [j["execution_start_time"] for j in await jobs_of(clients.alice, alice)]
        bob_first = min(j["execution_start_time"] for j in await jobs_of(clients.bob, bob))
        started_after_bob = sum(start > bob_first for start in alice_starts)
        if enabled:
            assert started_after_bob >= 2, (alice_starts, bob_first)
        else:
            assert started_after_bob == 0, (alice_starts, bob_first)


async def slot_time(client: Served, ids: list[str], since: float, until: float) -> float:
    """Slot-seconds the jobs ran within [since, until]."""
    total = 0.0
    for job in await jobs_of(client, ids):
        start, end = job["execution_start_time"], job["execution_end_time"]
        if start is None:
            continue
        end = until * 1000 if end is None else end
        total += max(0.0, min(end / 1000, until) - max(start / 1000, since))
    return total


async def test_weights_split_the_slot_time(tmp_path: Path) -> None:
    """Weights 3:1, both backlogged with prompts of different lengths: Alice's short
    ones and Bob's long ones; slot-time, not prompt count, splits 3:1."""
    policy = SharePolicy({"alice": TenantPolicy(weight=3.0)})
    async with tenants(tmp_path, local_slots=SLOTS, shares=policy) as clients:
        alice = await submit_many(clients.alice, 300, 0.1)
        bob = await submit_many(clients.bob, 60, 0.4)
        since = time.time() + 1.0  # past the start, both backlogged
        await asyncio.sleep(5.0)
        until = time.time()
        a = await slot_time(clients.alice, alice, since, until)
        b = await slot_time(clients.bob, bob, since, until)
        assert 0.65 < a / (a + b) < 0.85, (a, b)


async def test_a_tenant_at_its_cap_leaves_its_slots_to_others(tmp_path: Path) -> None:
    policy = SharePolicy({"alice": TenantPolicy(max_running=2)})
    async with tenants(tmp_path, local_slots=SLOTS, shares=policy) as clients:
        alice = await submit_many(clients.alice, 12, 0.5)
        most = 0

        async def alice_done() -> bool:
            nonlocal most
            # One read of her running prompts (asking each job in turn is no snapshot).
            running = await clients.alice.get("/api/jobs?status=in_progress&limit=1")
            most = max(most, running["pagination"]["total"])
            jobs = await jobs_of(clients.alice, alice)
            return all(j["status"] == "completed" for j in jobs)

        bob = await submit_many(clients.bob, 6, 0.5)
        await poll(alice_done, timeout=30, what="Alice's prompts to end", every=0.05)
        assert most == 2
        bob_jobs = await jobs_of(clients.bob, bob)
        assert all(j["status"] == "completed" for j in bob_jobs)


async def test_a_low_class_waits_at_most_twice_the_aging_behind_a_high_backlog(
    tmp_path: Path,
) -> None:
    """Alice (high) keeps 2 slots busy for 10 s; Bob's (low) prompt rises one class per
    second of aging: past two it competes as high, and his lesser use puts it first."""
    policy = SharePolicy(
        {"alice": TenantPolicy(priority="high"), "bob": TenantPolicy(priority="low")},
        aging=1.0,
    )
    async with tenants(tmp_path, local_slots=2, shares=policy) as clients:
        await submit_many(clients.alice, 200, 0.1)
        await asyncio.sleep(0.3)
        sent = time.time()
        (bob,) = await submit_many(clients.bob, 1, 0.1)

        async def started() -> bool:
            return (await clients.bob.job(bob))["execution_start_time"] is not None

        await poll(started, timeout=15, what="Bob's prompt to start", every=0.05)
        waited = (await clients.bob.job(bob))["execution_start_time"] / 1000 - sent
        assert 1.8 <= waited < 3.5, waited


async def test_the_tenants_shares_are_listed_and_exported(tmp_path: Path) -> None:
    policy = SharePolicy({"alice": TenantPolicy(weight=3.0, max_running=4)})
    async with tenants(tmp_path, local_slots=SLOTS, shares=policy) as clients:
        await submit_many(clients.alice, 40, 0.3)
        await submit_many(clients.bob, 40, 0.3)
        await asyncio.sleep(1.5)
        listed = await clients.root.request("GET", "/api/fleet/tenants")
        assert listed.status == 200, listed.json
        rows = {row["tenant"]: row for row in listed.json["tenants"]}
        alice, bob = rows["alice"], rows["bob"]
        assert (alice["weight"], alice["max_running"], alice["priority"]) == (3.0, 4, "normal")
        assert alice["running"] <= 4 and bob["running"] >= 4  # alice at her cap
        assert alice["pending"] > 0 and bob["pending"] > 0
        assert 0 < alice["share"] < 1 and abs(alice["share"] + bob["share"] - 1) < 0.01
        refused = await clients.alice.request("GET", "/api/fleet/tenants")
        assert refused.status == 403  # an admin's view
        metrics = await clients.root.session.get(f"{clients.root.url}/metrics")
        text = await metrics.text()
        assert 'comfyfleet_tenant_jobs{status="running",tenant="bob"}' in text
        assert 'comfyfleet_tenant_share{tenant="alice"}' in text
