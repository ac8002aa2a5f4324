"""Paid-job budgets against the provider emulator, through a real server: a prompt
whose jobs would pass its tenant's budget of the day (or its own) is refused at submit
and nothing reaches the provider; one whose count is known only as it runs fails the job
past the budget in its collector's status; the cost dry run counts what a run sends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.server.config import AuthToken
from comfyfleet.shares.policy import parse_policy
from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, KEY_ENV, Graph, start_emulator
from tests.integration.gateway.test_auth import as_tenant
from tests.integration.gateway.wire import Served, serve

ALICE = "alice-budget-token-5d1c"
BOB = "bob-budget-token-8e2f"
ROOT = "root-budget-token-6d0e"
TOKENS = (AuthToken(ALICE, "alice"), AuthToken(BOB, "bob"), AuthToken(ROOT, "default", admin=True))


@pytest.fixture
async def emulator(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Emulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the server's key vault reads its environment
    started = await start_emulator(latency=0.05)
    yield started
    await started.server.close()


def jobs_sent(emulator: Emulator) -> int:
    """Jobs the emulator created, summed over its per-key counters."""
    return sum(emulator.stats()["jobs_by_key"].values())


def fanout(url: str, jobs: int, *, seed: int = 0, mode: str = "fail_fast") -> dict[str, Any]:
    graph = Graph(url)
    tasks = [graph.submit(f"s{n}", "a lighthouse", seed + n) for n in range(jobs)]
    graph.collect("c", tasks, mode)
    return graph.prompt


def listed(url: str, items: int, seed: int) -> dict[str, Any]:
    """One submit fed a list of `items` images (Rebatch Images): it sends one job per item,
    so its count is known only as it runs."""
    graph = Graph(url)
    batch = "img0"
    for n in range(items):  # frames of different colours: equal ones would share a job
        graph.prompt[f"img{n}"] = {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": n * 0x101010},
        }
        if n:
            graph.prompt[f"batch{n}"] = {
                "class_type": "ImageBatch",
                "inputs": {"image1": [batch, 0], "image2": [f"img{n}", 0]},
            }
            batch = f"batch{n}"
    graph.prompt["list"] = {
        "class_type": "RebatchImages",
        "inputs": {"images": [batch, 0], "batch_size": 1},
    }
    graph.submit("s", "a lighthouse", seed, image1=["list", 0])
    graph.collect("c", ["s"], "placeholder")
    return graph.prompt


async def finished(client: Served, prompt_id: str) -> dict[str, Any]:
    await client.wait_job(prompt_id, "completed", "failed", "cancelled")
    return await client.history_entry(prompt_id)


def statuses(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Every slot of every collector run of the prompt (one run per list item)."""
    texts = entry["outputs"]["c"]["text"]
    return [slot for text in texts for slot in json.loads(text)["slots"] if "provider" in slot]


async def test_a_tenant_at_its_cap_is_refused_at_submit_and_nothing_is_sent(
    tmp_path: Path, emulator: Emulator
) -> None:
    policy = parse_policy({"alice": {"paid_jobs_per_day": 5}}, None)
    async with serve(tmp_path, auth_tokens=TOKENS, shares=policy, local_slots=4) as served:
        alice, bob = as_tenant(served, ALICE), as_tenant(served, BOB)
        try:
            first = await alice.submit(fanout(emulator.url, 5))
            entry = await finished(alice, first)
            assert entry["status"]["status_str"] == "success"
            assert jobs_sent(emulator) == 5

            # The same prompt again reuses its five results: no new job, so no refusal.
            dry = await alice.post("/comfyfleet/cost", {"prompt": fanout(emulator.url, 5)})
            assert (dry.json["paid_jobs"], dry.json["reused_jobs"]) == (0, 5)
            again = await alice.submit(fanout(emulator.url, 5))
            assert (await finished(alice, again))["status"]["status_str"] == "success"
            assert jobs_sent(emulator) == 5

            refused = await alice.post("/prompt", {"prompt": fanout(emulator.url, 30, seed=100)})
            assert refused.status == 400
            error = refused.json["error"]
            assert error["type"] == "budget_exceeded"
            assert "tenant alice's paid_jobs_per_day (today, UTC) = 5" in error["details"]
            assert "5 paid job(s) counted, 30 more asked for" in error["details"]
            assert refused.json["node_errors"] == {}
            v2 = await alice.post("/api/v2/jobs", {"workflow": fanout(emulator.url, 30, seed=100)})
            assert v2.status == 422 and "budget_exceeded" in v2.text  # v2's refusal shape
            assert jobs_sent(emulator) == 5  # not one of the 30 reached the provider
            assert (await alice.get("/queue"))["queue_pending"] == []

            # Bob has no cap: the same 30 go through.
            other = await bob.submit(fanout(emulator.url, 30, seed=100))
            assert (await finished(bob, other))["status"]["status_str"] == "success"
            assert jobs_sent(emulator) == 35

            # What each sent today, on the admin's list of tenants and in /metrics.
            root = as_tenant(served, ROOT)
            try:
                rows = {r["tenant"]: r for r in (await root.get("/api/fleet/tenants"))["tenants"]}
                assert (rows["alice"]["paid_jobs_today"], rows["bob"]["paid_jobs_today"]) == (5, 30)
                assert rows["bob"]["spend_today"] > rows["alice"]["spend_today"] > 0
                metrics = (await root.request("GET", "/metrics")).text
                assert 'comfyfleet_tenant_paid_jobs_today{tenant="bob"} 30.0' in metrics
                assert 'comfyfleet_tenant_spend_today_dollars{tenant="alice"}' in metrics
            finally:
                await root.session.close()
        finally:
            await alice.session.close()
            await bob.session.close()


async def test_a_prompts_own_budget_is_checked_at_submit(
    tmp_path: Path, emulator: Emulator
) -> None:
    async with serve(tmp_path, local_slots=2) as served:
        prompt = fanout(emulator.url, 3)
        over = {"prompt": prompt, "extra_data": {"comfyfleet_budget": {"paid_jobs": 2}}}
        refused = await served.post("/prompt", over)
        assert refused.status == 400
        assert refused.json["error"]["type"] == "budget_exceeded"
        assert (
            "the prompt's extra_data.comfyfleet_budget.paid_jobs = 2"
            in (refused.json["error"]["details"])
        )
        cheap = {"prompt": prompt, "extra_data": {"comfyfleet_budget": {"spend": 0.05}}}
        assert (await served.post("/prompt", cheap)).status == 400  # 3 x $0.03
        bad = {"prompt": prompt, "extra_data": {"comfyfleet_budget": {"paid_jobs": -1}}}
        reply = await served.post("/prompt", bad)
        assert reply.status == 400 and reply.json["error"]["type"] == "invalid_budget"
        assert "paid_jobs must be a whole number" in reply.json["error"]["details"]
        assert jobs_sent(emulator) == 0
        accepted = await served.submit(prompt, extra_data={"comfyfleet_budget": {"paid_jobs": 3}})
        assert (await finished(served, accepted))["status"]["status_str"] == "success"
        assert jobs_sent(emulator) == 3


async def test_a_job_past_the_budget_fails_in_the_status_when_the_count_is_not_known(
    tmp_path: Path, emulator: Emulator
) -> None:
    policy = parse_policy({"alice": {"paid_jobs_per_day": 2}}, None)
    async with serve(tmp_path, auth_tokens=TOKENS, shares=policy, local_slots=2) as served:
        alice = as_tenant(served, ALICE)
        try:
            prompt_id = await alice.submit(listed(emulator.url, 3, seed=7))  # not counted
            entry = await finished(alice, prompt_id)
        finally:
            await alice.session.close()
    assert entry["status"]["status_str"] == "success"  # placeholder mode
    slots = statuses(entry)
    assert sorted(slot["state"] for slot in slots) == ["failed", "success", "success"]
    [failed] = [slot for slot in slots if slot["state"] == "failed"]
    assert failed["error_class"] == "BudgetExceeded"
    assert failed["error"] == (
        "tenant alice's paid_jobs_per_day (today, UTC) = 2: 2 paid job(s) counted, 1 more asked for"
    )
    assert failed["remote_id"] is None and failed["http_status"] is None
    assert jobs_sent(emulator) == 2  # the third never reached the provider


async def test_a_job_past_the_prompts_budget_fails_a_fail_fast_collector(
    tmp_path: Path, emulator: Emulator
) -> None:
    prompt = listed(emulator.url, 3, seed=11)
    prompt["c"]["inputs"]["failure_mode"] = "fail_fast"
    async with serve(tmp_path, local_slots=2) as served:
        prompt_id = await served.submit(prompt, extra_data={"comfyfleet_budget": {"paid_jobs": 1}})
        entry = await finished(served, prompt_id)
    assert entry["status"]["status_str"] == "error"
    [error] = [data for name, data in entry["status"]["messages"] if name == "execution_error"]
    assert error["node_id"] == "c" and error["exception_type"].endswith("CollectFailed")
    assert (
        "BudgetExceeded: the prompt's extra_data.comfyfleet_budget.paid_jobs = 1"
        in (error["exception_message"])
    )
    assert jobs_sent(emulator) == 1


def mixed(url: str) -> dict[str, Any]:
    """Submits of two FLUX models (one pair equal: one job), OpenAI images, and a serial
    FLUX node saved on its own."""
    graph = Graph(url)
    tasks = [graph.submit(f"k{n}", "a cat", n, model="flux-kontext-pro") for n in range(3)]
    tasks.append(graph.submit("k-again", "a cat", 0, model="flux-kontext-pro"))
    tasks.append(graph.submit("p", "a dog", 9, model="flux-pro-1.1"))
    for n in range(2):
        inputs = {
            "prompt": f"a bird {n}",
            "model": "gpt-image-1",
            "size": "256x256",
            "quality": "auto",
            "response_format": "b64_json",
            "seed": n,
            "api_config": [graph.settings, 0],
        }
        graph.prompt[f"o{n}"] = {"class_type": "Concurrent Submit | OpenAIImage", "inputs": inputs}
        tasks.append(f"o{n}")
    graph.collect("c", tasks)
    graph.prompt["serial"] = {
        "class_type": "BFLFluxImage",
        "inputs": graph.flux_inputs("a fox", 3, model="flux-dev"),
    }
    graph.save("out", "serial", 0)
    return graph.prompt


async def test_the_dry_run_counts_what_a_run_sends(tmp_path: Path, emulator: Emulator) -> None:
    prompt = mixed(emulator.url)
    async with serve(tmp_path, local_slots=2) as served:
        reply = await served.post("/comfyfleet/cost", {"prompt": prompt})
        assert reply.status == 200, reply.text
        dry = reply.json
        assert jobs_sent(emulator) == 0  # a dry run sends nothing
        prompt_id = await served.submit(prompt)
        assert (await finished(served, prompt_id))["status"]["status_str"] == "success"
        # Run again, the prompt reuses every result: the dry run now says so.
        after = (await served.post("/comfyfleet/cost", {"prompt": prompt})).json
        assert (after["paid_jobs"], after["reused_jobs"], after["cost"]) == (0, 7, 0)
        assert {job["model"]: job["count"] for job in after["reused"]} == {
            "flux-kontext-pro": 3,
            "flux-pro-1.1": 1,
            "gpt-image-1": 2,
            "flux-dev": 1,
        }
        assert after["budget"]["today"]["paid_jobs"] == 7
    stats = emulator.stats()
    by_model = {job["model"]: job["count"] for job in dry["jobs"]}
    assert by_model == {"flux-kontext-pro": 3, "flux-pro-1.1": 1, "gpt-image-1": 2, "flux-dev": 1}
    assert by_model == stats["jobs_by_model"]
    assert dry["paid_jobs"] == jobs_sent(emulator) == 7
    assert dry["cost"] == pytest.approx(3 * 0.04 + 0.04 + 2 * 0.04 + 0.025)
    assert dry["budget"]["refusal"] is None
    assert dry["budget"]["today"] == {"paid_jobs": 0, "spend": 0}
    assert dry["reused_jobs"] == 0

    workflow = tmp_path / "mixed.json"
    workflow.write_text(json.dumps(prompt))
    command = [sys.executable, "-m", "comfyfleet", "validate", "--cost", str(workflow)]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {key: value for key, value in dry.items() if key != "budget"}
    assert "bfl flux-kontext-pro: 3 job(s), $0.1200" in done.stderr
    assert "total: 7 paid job(s), $0.2650" in done.stderr
