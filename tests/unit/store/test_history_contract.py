"""The history contract (entries, paging, deletion, retention), run over every store.

The fixtures (conftest.py) run each test once per store.
"""

from __future__ import annotations

from typing import Any

from comfyfleet.domain.jobs import JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.store.base import JobStore
from tests.helpers import load_scenario
from tests.unit.store.job_helpers import history_ids, new_job, output_files, result, run_one
from tests.unit.store.stores import Clock, claim_next

# -- history ------------------------------------------------------------------------------


async def test_history_paging(store: JobStore) -> None:
    for i in range(5):
        await store.submit(new_job(f"p{i}", i))
        await run_one(store)
    assert await history_ids(store) == ["p0", "p1", "p2", "p3", "p4"]
    assert await history_ids(store, 2) == ["p3", "p4"]
    assert await history_ids(store, 2, 1) == ["p1", "p2"]
    assert await history_ids(store, None, 3) == ["p3", "p4"]
    assert await history_ids(store, 10) == ["p0", "p1", "p2", "p3", "p4"]
    assert await history_ids(store, 2, 4) == ["p4"]
    assert await history_ids(store, 2, 9) == []
    assert await history_ids(store, 0) == []
    assert await history_ids(store, 2, -1) == ["p3", "p4"]


async def test_history_is_in_completion_order(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    jobs = [await claim_next(store, "lane") for _ in range(3)]
    for job in reversed(jobs):
        assert job is not None
        await store.finish(job.prompt_id, job.attempt, result())
    assert await history_ids(store) == ["p2", "p1", "p0"]


def _recorded_result(entry: dict[str, Any]) -> JobResult:
    status = entry["status"]
    kinds = [kind for kind, _ in status["messages"]]
    if status["status_str"] == "success":
        final = JobStatus.SUCCESS
    else:
        final = JobStatus.INTERRUPTED if "execution_interrupted" in kinds else JobStatus.ERROR
    return JobResult(final, entry["outputs"], entry["meta"], status["messages"])


async def test_history_paging_matches_comfyui_reference(store: JobStore) -> None:
    steps = load_scenario("08-history-api")["steps"]
    newest_two = next(s for s in steps if s.get("path") == "/history?max_items=2")
    skip_one = next(s for s in steps if s.get("path") == "/history?max_items=2&offset=1")
    recorded = {**newest_two["response_json"], **skip_one["response_json"]}
    # ComfyUI's history held entries numbered 0..31; the unrecorded ones are stand-ins.
    by_number = {entry["prompt"][0]: (pid, entry) for pid, entry in recorded.items()}
    for number in range(32):
        if number in by_number:
            pid, entry = by_number[number]
            _, _, prompt, extra, outputs = entry["prompt"]
            job = NewJob(pid, number, False, prompt, extra, outputs, extra.get("client_id"))
            done = _recorded_result(entry)
        else:
            job, done = new_job(f"filler-{number}", number), result()
        await store.submit(job)
        await run_one(store, done)

    for step in (newest_two, skip_one):
        max_items = 2
        offset = 1 if "offset" in step["path"] else None
        entries = await store.history(max_items, offset)
        shown = {entry.job.prompt_id: entry.comfy() for entry in entries}
        assert list(shown) == list(step["response_json"])
        assert shown == step["response_json"]


async def test_history_entry_unknown(store: JobStore) -> None:
    assert await store.history_entry("missing") is None


async def test_delete_and_clear_history(store: JobStore) -> None:
    for i in range(4):
        await store.submit(new_job(f"p{i}", i))
        await run_one(store)
    await store.delete_history(["p1", "missing"])
    assert await history_ids(store) == ["p0", "p2", "p3"]
    assert await store.history_entry("p1") is None
    kept = await store.get("p1")
    assert kept is not None and kept.status is JobStatus.SUCCESS
    await store.clear_history()
    assert await store.history() == []
    assert (await store.counts())[JobStatus.SUCCESS] == 4
    await store.submit(new_job("p9", 9))
    await run_one(store)
    assert await history_ids(store) == ["p9"]


# -- retention --------------------------------------------------------------------------


async def _finished_jobs(store: JobStore, clock: Clock, count: int) -> None:
    for i in range(count):
        clock.advance(10)
        await store.submit(new_job(f"p{i}", i))
        await run_one(store, result(files=output_files(f"p{i}")))


async def test_prune_by_count(store: JobStore, clock: Clock) -> None:
    await _finished_jobs(store, clock, 5)
    files = await store.prune_history(max_entries=2, max_age_seconds=None)
    assert files == output_files("p0") + output_files("p1") + output_files("p2")
    assert await history_ids(store) == ["p3", "p4"]
    assert await store.get("p0") is None
    _, total = await store.jobs()
    assert total == 2
    assert await store.prune_history(max_entries=2, max_age_seconds=None) == []


async def test_listed_outputs_are_those_a_job_still_lists(store: JobStore, clock: Clock) -> None:
    """What a gateway asks of the copies it fetched from peers: is its history gone?"""
    shown = OutputFile("a.png", "sub", "output")
    preview = OutputFile("b.png", "", "temp")
    theirs = OutputFile("c.png", "", "output", "alice")
    await store.submit(new_job("p1", 1))
    await run_one(store, result(files=[shown, preview]))
    clock.advance(10)
    await store.submit(new_job("p2", 2, tenant="alice"))
    await run_one(store, result(files=[theirs]))
    asked = [
        shown,
        preview,
        theirs,
        OutputFile("a.png", "sub", "temp"),  # another folder
        OutputFile("a.png", "", "output"),  # another subfolder
        OutputFile("c.png", "", "output"),  # another tenant's name
        OutputFile("x.png", "", "output"),
    ]
    assert await store.listed_outputs(asked) == {shown, preview, theirs}
    assert await store.listed_outputs([]) == set()
    # An entry deleted by hand leaves its job and files (pruned later); pruned, they go.
    await store.delete_history(["p1"])
    assert await store.listed_outputs(asked) == {shown, preview, theirs}
    assert await store.prune_history(max_entries=None, max_age_seconds=5) == [shown, preview]
    assert await store.listed_outputs(asked) == {theirs}


async def test_prune_by_age(store: JobStore, clock: Clock) -> None:
    await _finished_jobs(store, clock, 5)  # finished 40, 30, 20, 10, 0 seconds ago
    files = await store.prune_history(max_entries=None, max_age_seconds=15)
    assert files == output_files("p0") + output_files("p1") + output_files("p2")
    assert await history_ids(store) == ["p3", "p4"]
    assert await store.prune_history(max_entries=None, max_age_seconds=None) == []
    assert await store.prune_history(max_entries=10, max_age_seconds=1000) == []


async def test_prune_keeps_live_jobs_and_drops_old_unlisted_ones(
    store: JobStore, clock: Clock
) -> None:
    await _finished_jobs(store, clock, 3)
    await store.delete_history(["p0"])  # unlisted, but its files are still on disk
    await store.submit(new_job("waiting", 100))
    await store.submit(new_job("gone", 101))
    await store.cancel(["gone"], pending_only=True)
    clock.advance(1000)
    files = await store.prune_history(max_entries=None, max_age_seconds=500)
    assert set(files) == set(output_files("p0") + output_files("p1") + output_files("p2"))
    assert await store.get("gone") is None
    assert await store.get("waiting") is not None
    assert await store.history() == []
