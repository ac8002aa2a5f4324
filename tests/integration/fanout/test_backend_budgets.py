"""Budgets of prompts a gateway sends to a backend: the gateway grants each an allowance
out of its tenant's budget of the day and holds it; the backend (here another comfyfleet,
running the paid nodes against the provider emulator) refuses the job past the
allowance; at the prompt's end the gateway counts what the backend says it spent in
place of the hold. A gateway with auth feeds one backend; no local slots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from comfyfleet.shares.policy import parse_policy
from tests.emulators import Emulator
from tests.integration.fanout.test_budgets import (
    ALICE,
    ROOT,
    TOKENS,
    emulator,
    fanout,
    finished,
    jobs_sent,
    listed,
    statuses,
)
from tests.integration.gateway.test_auth import as_tenant
from tests.integration.gateway.wire import Served, poll, serve
from tests.servers import start_in_process

__all__ = ["emulator"]  # the fixture, shared with test_budgets


@asynccontextmanager
async def gateway_with_backend(tmp_path: Path, day_jobs: int) -> AsyncIterator[Served]:
    """Alice's client, on a gateway whose only lane is a comfyfleet backend."""
    backend, _ = await start_in_process(tmp_path / "backend", local_slots=4)
    policy = parse_policy({"alice": {"paid_jobs_per_day": day_jobs}}, None)
    try:
        async with serve(
            tmp_path / "gateway",
            local_slots=0,
            backends=({"url": f"http://127.0.0.1:{backend.port}", "name": "gpu"},),
            auth_tokens=TOKENS,
            shares=policy,
        ) as served:
            root, alice = as_tenant(served, ROOT), as_tenant(served, ALICE)
            try:

                async def backend_up() -> bool:
                    listed = await root.get("/api/fleet/backends")
                    return [b["state"] for b in listed["backends"]] == ["up"]

                await poll(backend_up, what="the backend up")
                yield alice
            finally:
                for client in (root, alice):  # their own sessions: serve closes its own
                    await client.session.close()
    finally:
        await backend.close()


async def side_by_side_within_three(client: Served, emulator: Emulator) -> None:
    """A tenant with 3 paid jobs a day sends 2 prompts at once through a backend: the
    first holds its 2 counted jobs as it is sent; the second's count is known only as it
    runs (a list), so submit lets it in, and its allowance is what is left (or, sent
    first, it takes all that is left and the first gets none). At most 3 of the 4 jobs
    are sent, and both holds settle at what the backend sent."""
    first = await client.submit(fanout(emulator.url, 2, mode="placeholder"))
    second = await client.submit(listed(emulator.url, 2, seed=50))
    entries = await asyncio.gather(finished(client, first), finished(client, second))
    slots = [slot for entry in entries for slot in statuses(entry)]
    refused = [slot for slot in slots if slot.get("error_class") == "BudgetExceeded"]
    assert jobs_sent(emulator) <= 3
    assert jobs_sent(emulator) + len(refused) == 4
    assert "comfyfleet_allowance" in refused[0]["error"]

    async def counted() -> bool:
        dry = await client.post("/comfyfleet/cost", {"prompt": fanout(emulator.url, 1, seed=9)})
        return bool(dry.json["budget"]["today"]["paid_jobs"] == jobs_sent(emulator))

    await poll(counted, what="the holds settled", timeout=30)


async def test_prompts_side_by_side_on_a_backend_never_pass_the_tenants_budget(
    tmp_path: Path, emulator: Emulator
) -> None:
    async with gateway_with_backend(tmp_path, day_jobs=3) as alice:
        await side_by_side_within_three(alice, emulator)


async def test_what_a_prompt_did_not_spend_on_the_backend_is_free_again(
    tmp_path: Path, emulator: Emulator
) -> None:
    async with gateway_with_backend(tmp_path, day_jobs=4) as alice:
        first = await alice.submit(fanout(emulator.url, 2))
        assert (await finished(alice, first))["status"]["status_str"] == "success"
        # The same requests again: the gateway holds 2 for it, the backend's journal
        # reuses both results and says so at its end.
        again = await alice.submit(fanout(emulator.url, 2))
        assert (await finished(alice, again))["status"]["status_str"] == "success"
        assert jobs_sent(emulator) == 2

        async def settled() -> bool:
            dry = await alice.post("/comfyfleet/cost", {"prompt": fanout(emulator.url, 1, seed=7)})
            return bool(dry.json["budget"]["today"]["paid_jobs"] == 2)

        await poll(settled, what="the second prompt's hold settled at 0")
        third = await alice.submit(fanout(emulator.url, 2, seed=20))  # 2 + 2 of 4
        assert (await finished(alice, third))["status"]["status_str"] == "success"
        assert jobs_sent(emulator) == 4
