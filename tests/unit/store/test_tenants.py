"""Jobs belong to tenants: scoped reads and writes, in every store (see conftest.py)."""

from __future__ import annotations

import pytest

from comfyfleet.domain.jobs import HistoryEntry, JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.store.base import JobStore
from comfyfleet.tenants import check_tenant_name
from tests.unit.store.stores import claim_next


def new_job(prompt_id: str, tenant: str = "default", number: float = 1) -> NewJob:
    prompt = {"1": {"class_type": "Noop", "inputs": {}}}
    return NewJob(prompt_id, number, False, prompt, {}, ["1"], tenant=tenant)


async def run_to_end(store: JobStore, prompt_id: str) -> None:
    """Claim `prompt_id` (it must be next in line) and finish it with one output file."""
    job = await claim_next(store, "lane")
    assert job is not None and job.prompt_id == prompt_id
    files = [OutputFile(f"{prompt_id}.png", "", "output")]
    result = JobResult(JobStatus.SUCCESS, {"1": {}}, {}, [], None, files)
    assert await store.finish(prompt_id, job.attempt, result)


async def test_jobs_keep_their_tenant(store: JobStore) -> None:
    submitted = await store.submit(new_job("a1", "alice"))
    assert submitted.tenant == "alice"
    fetched = await store.get("a1")
    assert fetched is not None and fetched.tenant == "alice"
    await store.submit(NewJob("d1", 2, False, {}, {}, []))
    fetched = await store.get("d1")
    assert fetched is not None and fetched.tenant == "default"


async def test_queue_jobs_and_counts_scoped_to_a_tenant(store: JobStore) -> None:
    for prompt_id, tenant in [("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("b2", "bob")]:
        await store.submit(new_job(prompt_id, tenant))
    running = await claim_next(store, "lane")
    assert running is not None and running.prompt_id == "a1"

    assert [[j.prompt_id for j in part] for part in await store.queue(tenant="alice")] == [
        ["a1"],
        ["a2"],
    ]
    assert [[j.prompt_id for j in part] for part in await store.queue(tenant="bob")] == [
        [],
        ["b1", "b2"],
    ]
    assert [[j.prompt_id for j in part] for part in await store.queue()] == [
        ["a1"],
        ["b1", "a2", "b2"],
    ]
    assert await store.active_count("alice") == 2
    assert await store.active_count("nobody") == 0

    jobs, total = await store.jobs(tenant="bob", newest_first=False)
    assert ([j.prompt_id for j in jobs], total) == (["b1", "b2"], 2)
    jobs, total = await store.jobs(tenant="alice", statuses=[JobStatus.RUNNING])
    assert ([j.prompt_id for j in jobs], total) == (["a1"], 1)
    assert (await store.jobs())[1] == 4

    assert await store.owned(["b2", "a1", "zz", "a2", "a1"], "alice") == ["a1", "a2"]


async def test_history_scoped_to_a_tenant(store: JobStore) -> None:
    order = [("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("a3", "alice")]
    for number, (prompt_id, tenant) in enumerate(order):
        await store.submit(new_job(prompt_id, tenant, number))
    for prompt_id, _ in order:
        await run_to_end(store, prompt_id)

    def ids(entries: list[HistoryEntry]) -> list[str]:
        return [e.job.prompt_id for e in entries]

    assert ids(await store.history(tenant="alice")) == ["a1", "a2", "a3"]
    assert ids(await store.history(2, tenant="alice")) == ["a2", "a3"]  # the newest two
    assert ids(await store.history(1, 1, tenant="alice")) == ["a2"]
    assert ids(await store.history(tenant="bob")) == ["b1"]
    assert ids(await store.history()) == ["a1", "b1", "a2", "a3"]

    await store.clear_history(tenant="alice")
    assert ids(await store.history()) == ["b1"]
    assert await store.history_entry("a1") is None
    assert await store.get("a1") is not None  # the jobs stay


async def test_pruned_files_name_their_tenant(store: JobStore) -> None:
    await store.submit(new_job("a1", "alice", 1))
    await store.submit(new_job("b1", "bob", 2))
    await store.submit(new_job("d1", "default", 3))
    for prompt_id in ("a1", "b1", "d1"):
        await run_to_end(store, prompt_id)
    files = await store.prune_history(max_entries=0, max_age_seconds=None)
    assert [(f.filename, f.tenant) for f in files] == [
        ("a1.png", "alice"),
        ("b1.png", "bob"),
        ("d1.png", "default"),
    ]


def test_tenant_names_are_matched_whole() -> None:
    assert check_tenant_name("team-a_1") == "team-a_1"
    for bad in ("team\n", "", "a" * 65, "../x", "a b", "é", 7):
        with pytest.raises(ValueError):
            check_tenant_name(bad)
