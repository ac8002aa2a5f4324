"""The jobs and queue contract (submit, dispatch, claims, fencing, cancel, counts), run
against every store implementation.

Only the public interface is used here; store-specific behaviour has its own
test module. The fixtures (conftest.py) run each test once per store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from comfyfleet.domain.jobs import HistoryEntry, Job, JobStatus, NewJob, OutputFile
from comfyfleet.store.base import MAX_CANDIDATES, JobStore, StoreError
from tests.helpers import load_scenario
from tests.unit.store.job_helpers import assert_started, new_job, output_files, result, run_one
from tests.unit.store.stores import Clock, claim_next, reserve_next

# -- submit -------------------------------------------------------------------------


async def test_submit_get_round_trip_is_exact(store: JobStore, clock: Clock) -> None:
    prompt = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "color": 0.0, "seed": 2**53}},
        "2": {
            "class_type": "Text",
            "inputs": {"text": 'héllo \u2603 "q" \\', "list": [1, 1.5, None]},
        },
    }
    extra = {"client_id": "abc", "extra_pnginfo": {"workflow": {"nested": [True, False, {}]}}}
    submitted = await store.submit(
        NewJob("p1", 24, False, prompt, extra, ["2", "1"], "abc", {"2": {"errors": []}})
    )
    got = await store.get("p1")
    assert got == submitted
    assert got is not None
    assert got.prompt == prompt and got.extra_data == extra and got.outputs == ["2", "1"]
    assert got.status is JobStatus.PENDING and got.attempt == 0 and got.lane is None
    assert got.client_id == "abc" and got.created_at == clock.now
    assert got.queue_item() == [24, "p1", prompt, extra, ["2", "1"]]
    assert isinstance(got.number, int)
    assert isinstance(got.prompt["1"]["inputs"]["color"], float)


async def test_number_keeps_its_type(store: JobStore) -> None:
    await store.submit(new_job("explicit", 100.0))
    await store.submit(new_job("counter", 24))
    await store.submit(new_job("front", -25, front=True))
    explicit, counter, front = [await store.get(i) for i in ("explicit", "counter", "front")]
    assert explicit is not None and counter is not None and front is not None
    assert repr(explicit.number) == "100.0"
    assert repr(counter.number) == "24"
    assert repr(front.number) == "-25" and front.front


async def test_submit_assigns_increasing_seq(store: JobStore) -> None:
    jobs = [await store.submit(new_job(f"p{i}")) for i in range(5)]
    seqs = [job.seq for job in jobs]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


async def test_duplicate_id_is_refused(store: JobStore) -> None:
    await store.submit(new_job("p1", 1))
    with pytest.raises(StoreError):
        await store.submit(new_job("p1", 2))
    got = await store.get("p1")
    assert got is not None and got.number == 1
    assert await store.get("missing") is None


# -- dispatch -------------------------------------------------------------------------

# The prompts of ComfyUI's 07-queue scenario, in submission order, with the numbers
# ComfyUI gave them. ComfyUI ran C before B (front numbers are a negated counter, so
# later front prompts jump ahead); we deliberately keep front prompts FIFO.
QUEUE_SCENARIO: list[tuple[str, float, bool]] = [
    ("A", 24, False),
    ("B", -25, True),
    ("C", -26, True),
    ("D", 27, False),
    ("E", 0.5, False),
    ("F", 28, False),
    ("G", 100.0, False),
]


async def test_dispatch_order_front_fifo_then_number_then_seq(store: JobStore) -> None:
    for name, number, front in QUEUE_SCENARIO:
        await store.submit(new_job(name, number, front=front))
    _, pending = await store.queue()
    assert [job.prompt_id for job in pending] == ["B", "C", "E", "A", "D", "F", "G"]
    claimed = [await claim_next(store, "lane") for _ in QUEUE_SCENARIO]
    assert [job.prompt_id for job in claimed if job] == ["B", "C", "E", "A", "D", "F", "G"]
    assert await claim_next(store, "lane") is None


async def test_equal_numbers_run_in_submission_order(store: JobStore) -> None:
    for name in ("x", "y", "z"):
        await store.submit(new_job(name, 5.0))
    await store.submit(new_job("early", 1.0))
    order = [(await claim_next(store, "lane")) for _ in range(4)]
    assert [job.prompt_id for job in order if job] == ["early", "x", "y", "z"]


async def test_agrees_with_comfyui_queue_numbers() -> None:
    recorded = next(
        step
        for step in load_scenario("07-queue")["steps"]
        if step.get("kind") == "note" and "numbers" in step
    )
    assert {name: number for name, number, _ in QUEUE_SCENARIO} == {
        name: recorded["numbers"][name] for name, _, _ in QUEUE_SCENARIO
    }


async def test_claim_sets_running_attempt_lane(store: JobStore, clock: Clock) -> None:
    await store.submit(new_job("p1"))
    clock.advance(5)
    job = await claim_next(store, "local/0")
    assert_started(job, "local/0", clock.now)
    assert await store.get("p1") == job


async def test_submit_claimed_for_a_lane_is_running_at_once(store: JobStore, clock: Clock) -> None:
    job = await store.submit(new_job("p1"), claim_for="local")
    assert_started(job, "local", clock.now)
    assert await store.get("p1") == job
    assert await claim_next(store, "other") is None  # nobody else can take it
    assert await store.finish("p1", 1, result())
    assert (await store.get("p1")).status == JobStatus.SUCCESS  # type: ignore[union-attr]


async def test_candidates_are_claimable_jobs_in_dispatch_order_paged(store: JobStore) -> None:
    for name, number, front in QUEUE_SCENARIO:
        await store.submit(new_job(name, number, front=front))
    await reserve_next(store, "busy")  # B: set aside, no longer a candidate
    order = ["C", "E", "A", "D", "F", "G"]
    assert [job.prompt_id for job in await store.candidates(100)] == order
    first = await store.candidates(2)
    assert [job.prompt_id for job in first] == ["C", "E"]
    assert all(job.status is JobStatus.PENDING and job.lane is None for job in first)
    second = await store.candidates(3, after=first[-1])
    assert [job.prompt_id for job in second] == ["A", "D", "F"]
    assert [job.prompt_id for job in await store.candidates(3, after=second[-1])] == ["G"]
    assert await store.candidates(3, after=(await store.candidates(100))[-1]) == []
    # Reading takes nothing.
    _, pending = await store.queue()
    assert [job.prompt_id for job in pending] == ["B", *order]


async def test_a_later_page_starts_past_a_cursor_taken_meanwhile(store: JobStore) -> None:
    for i in range(4):
        await store.submit(new_job(f"p{i}", i))
    [first] = await store.candidates(1)
    assert await store.claim_job(first, "elsewhere") is not None
    after = await store.candidates(2, after=first)
    assert [job.prompt_id for job in after] == ["p1", "p2"]


async def test_candidate_pages_are_capped(store: JobStore) -> None:
    for i in range(MAX_CANDIDATES + 3):
        await store.submit(new_job(f"p{i}", i))
    assert len(await store.candidates(10**9)) == MAX_CANDIDATES
    assert [job.prompt_id for job in await store.candidates(0)] == ["p0"]


async def test_claim_job_takes_the_named_candidate(store: JobStore, clock: Clock) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    candidates = await store.candidates(3)
    clock.advance(2)
    job = await store.claim_job(candidates[1], "lane")
    assert_started(job, "lane", clock.now)
    assert await store.get("p1") == job
    assert [c.prompt_id for c in await store.candidates(3)] == ["p0", "p2"]


async def test_claim_job_is_refused_once_the_candidate_moved(store: JobStore) -> None:
    for i in range(4):
        await store.submit(new_job(f"p{i}", i))
    p0, p1, p2, p3 = await store.candidates(4)
    assert await store.claim_job(p0, "a") is not None
    assert await store.claim_job(p0, "b") is None  # claimed already
    assert await store.reserve_job(p0, "b") is None
    assert await store.reserve_job(p1, "a") is not None
    assert await store.claim_job(p1, "b") is None  # set aside for another lane
    assert await store.cancel(["p2"], pending_only=True) == ["p2"]
    assert await store.claim_job(p2, "b") is None  # cancelled
    # Claimed and given back meanwhile: pending again, but at another attempt.
    taken = await store.claim_job(p3, "a")
    assert taken is not None and await store.requeue("p3", taken.attempt)
    assert await store.claim_job(p3, "b") is None
    assert await store.reserve_job(p3, "b") is None
    [fresh] = await store.candidates(4)
    again = await store.claim_job(fresh, "b")
    assert again is not None and (again.prompt_id, again.attempt, again.lane) == ("p3", 2, "b")
    assert (await store.get("p3")) == again


async def test_claim_job_is_taken_once_by_many_claimers(store: JobStore) -> None:
    await store.submit(new_job("p1"))
    [job] = await store.candidates(1)
    taken = await asyncio.gather(*(store.claim_job(job, f"lane-{i}") for i in range(8)))
    assert len([t for t in taken if t is not None]) == 1


# -- reservations ----------------------------------------------------------------------


async def test_reserve_sets_a_job_aside_still_pending(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    _, p1, _ = await store.candidates(3)
    reserved = await store.reserve_job(p1, "busy")
    assert reserved is not None
    assert (reserved.prompt_id, reserved.status, reserved.lane, reserved.attempt) == (
        "p1",
        JobStatus.PENDING,
        "busy",
        0,
    )
    assert await store.get("p1") == reserved
    _, pending = await store.queue()  # still listed in queue order
    assert [job.prompt_id for job in pending] == ["p0", "p1", "p2"]
    assert (await store.counts())[JobStatus.PENDING] == 3
    # Claims and other reservations pass it by.
    assert await store.reserve_job(p1, "other") is None
    second = await reserve_next(store, "other")
    assert second is not None and second.prompt_id == "p0"
    claimed = await claim_next(store, "free")
    assert claimed is not None and claimed.prompt_id == "p2"
    assert await claim_next(store, "free") is None


async def test_start_reserved_runs_it_on_any_lane_once(store: JobStore, clock: Clock) -> None:
    await store.submit(new_job("p1"))
    reserved = await reserve_next(store, "a")
    assert reserved is not None
    clock.advance(3)
    started = await store.start_reserved(reserved, "b")  # another lane took it over
    assert_started(started, "b", clock.now)
    assert await store.get("p1") == started
    assert await store.start_reserved(reserved, "a") is None  # not twice
    assert await store.finish("p1", 1, result())


async def test_start_reserved_refused_once_given_back_or_cancelled(store: JobStore) -> None:
    for i in range(2):
        await store.submit(new_job(f"p{i}", i))
    first = await reserve_next(store, "a")
    second = await reserve_next(store, "a")
    assert first is not None and second is not None
    await store.unreserve([first.prompt_id, "missing"])
    assert await store.start_reserved(first, "a") is None  # given back: a claim may take it
    claimed = await claim_next(store, "b")
    assert claimed is not None and claimed.prompt_id == first.prompt_id
    assert await store.cancel([second.prompt_id], pending_only=True) == [second.prompt_id]
    assert await store.start_reserved(second, "a") is None
    assert (await store.get(second.prompt_id)).status is JobStatus.CANCELLED  # type: ignore[union-attr]


async def test_start_reserved_is_fenced_by_the_reserving_lane(store: JobStore) -> None:
    await store.submit(new_job("p1"))
    reserved = await reserve_next(store, "a")
    assert reserved is not None
    await store.unreserve(["p1"])
    again = await reserve_next(store, "b")
    assert again is not None
    assert await store.start_reserved(reserved, "a") is None  # a's reservation is gone
    started = await store.start_reserved(again, "b")
    assert started is not None and started.lane == "b"


async def test_reservations_survive_reopen(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    await store.submit(new_job("p1"))
    await reserve_next(store, "a")
    store = await reopen(store)
    try:
        _, pending = await store.queue()
        assert [(job.prompt_id, job.lane) for job in pending] == [("p1", "a")]
        assert await claim_next(store, "b") is None
        await store.unreserve(["p1"])
        claimed = await claim_next(store, "b")
        assert claimed is not None and claimed.prompt_id == "p1"
    finally:
        await store.close()


async def test_requeued_job_is_claimable_again(store: JobStore) -> None:
    await store.submit(new_job("p1"))
    reserved = await reserve_next(store, "a")
    assert reserved is not None
    started = await store.start_reserved(reserved, "a")
    assert started is not None
    assert await store.requeue("p1", started.attempt)
    claimed = await claim_next(store, "b")  # requeue clears the lane: no stale reservation
    assert claimed is not None and claimed.attempt == 2


# -- fencing -------------------------------------------------------------------------


async def test_stale_attempts_change_nothing(store: JobStore) -> None:
    await store.submit(new_job("p1"))
    first = await claim_next(store, "lane-a")
    assert first is not None and first.attempt == 1
    assert not await store.requeue("p1", 2)
    assert await store.requeue("p1", 1)
    requeued = await store.get("p1")
    assert requeued is not None
    assert (requeued.status, requeued.lane, requeued.attempt) == (JobStatus.PENDING, None, 1)
    assert not await store.requeue("p1", 1)  # not running any more

    second = await claim_next(store, "lane-b")
    assert second is not None and second.attempt == 2 and second.lane == "lane-b"
    assert not await store.finish("p1", 1, result())
    assert not await store.requeue("p1", 1)
    unchanged = await store.get("p1")
    assert unchanged == second
    assert await store.history_entry("p1") is None

    assert await store.finish("p1", 2, result())
    assert not await store.finish("p1", 2, result(JobStatus.ERROR))
    done = await store.get("p1")
    assert done is not None and done.status is JobStatus.SUCCESS


async def test_finish_unknown_or_pending_job_is_refused(store: JobStore) -> None:
    assert not await store.finish("missing", 1, result())
    await store.submit(new_job("p1"))
    assert not await store.finish("p1", 0, result())
    assert not await store.requeue("p1", 0)
    assert (await store.counts())[JobStatus.PENDING] == 1


async def test_requeued_job_keeps_its_place(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    job = await claim_next(store, "lane")
    assert job is not None and job.prompt_id == "p0"
    await store.requeue("p0", 1)
    _, pending = await store.queue()
    assert [job.prompt_id for job in pending] == ["p0", "p1", "p2"]


async def test_requeue_lane_by_prefix(store: JobStore) -> None:
    for i in range(4):
        await store.submit(new_job(f"p{i}", i))
    for lane in ("local/0", "remote/x", "local/1"):
        await claim_next(store, lane)
    assert await store.requeue_lane("local/") == ["p0", "p2"]
    running, pending = await store.queue()
    assert [job.prompt_id for job in running] == ["p1"]
    assert [job.prompt_id for job in pending] == ["p0", "p2", "p3"]
    assert await store.requeue_lane("local/") == []


# -- finish ---------------------------------------------------------------------------


async def test_finish_writes_history_events_andoutput_files(store: JobStore, clock: Clock) -> None:
    await store.submit(new_job("p1", 3, extra_data={"client_id": "c"}, client_id="c"))
    job = await claim_next(store, "lane")
    assert job is not None
    clock.advance(2)
    files = [OutputFile("a.png", "", "output"), OutputFile("b.png", "sub", "temp")]
    messages = [
        ["execution_start", {"prompt_id": "p1", "timestamp": 1}],
        ["execution_cached", {"nodes": [], "prompt_id": "p1", "timestamp": 2}],
        ["execution_success", {"prompt_id": "p1", "timestamp": 3}],
    ]
    outputs = {"9": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}}
    meta = {"9": {"node_id": "9", "display_node": "9", "parent_node": None, "real_node_id": "9"}}
    done = result(files=files, messages=messages, outputs=outputs, meta=meta)
    assert await store.finish("p1", job.attempt, done)

    entry = await store.history_entry("p1")
    assert entry is not None
    assert entry.result == done
    assert entry.job.status is JobStatus.SUCCESS and entry.job.finished_at == clock.now
    assert entry.comfy() == {
        "prompt": [3, "p1", job.prompt, {"client_id": "c"}, ["1"]],
        "outputs": outputs,
        "status": {"status_str": "success", "completed": True, "messages": messages},
        "meta": meta,
    }


@pytest.mark.parametrize("status", [JobStatus.ERROR, JobStatus.INTERRUPTED])
async def test_failed_attempts_are_history_with_error(store: JobStore, status: JobStatus) -> None:
    await store.submit(new_job("p1"))
    job = await claim_next(store, "lane")
    assert job is not None
    error = {"prompt_id": "p1", "node_id": "2", "exception_message": "boom", "traceback": []}
    assert await store.finish("p1", job.attempt, result(status, error=error))
    entry = await store.history_entry("p1")
    assert entry is not None
    assert entry.result.status is status and entry.result.error == error
    assert entry.job.error == error and entry.job.status is status
    assert entry.comfy()["status"]["status_str"] == "error"


async def test_finish_cancelled_before_it_began_leaves_no_history(store: JobStore) -> None:
    await store.submit(new_job("p1"))
    job = await claim_next(store, "lane")
    assert job is not None
    assert await store.finish("p1", job.attempt, result(JobStatus.CANCELLED, messages=[]))
    assert await store.history_entry("p1") is None
    got = await store.get("p1")
    assert got is not None and got.status is JobStatus.CANCELLED


async def test_finish_cancelled_mid_run_leaves_an_interrupted_entry(store: JobStore) -> None:
    # As ComfyUI records a prompt stopped mid-run: status_str error, its messages.
    await store.submit(new_job("p1"))
    job = await claim_next(store, "lane")
    assert job is not None
    stopped = [["execution_start", {"prompt_id": "p1"}], ["execution_interrupted", {}]]
    assert await store.finish("p1", job.attempt, result(JobStatus.CANCELLED, messages=stopped))
    entry = await store.history_entry("p1")
    assert entry is not None and entry.job.status is JobStatus.CANCELLED
    status = entry.comfy()["status"]
    assert (status["status_str"], status["completed"]) == ("error", False)
    assert [kind for kind, _ in status["messages"]] == ["execution_start", "execution_interrupted"]


# -- cancel ---------------------------------------------------------------------------


async def test_cancel_pending_only(store: JobStore, clock: Clock) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    await claim_next(store, "lane")  # p0 runs
    clock.advance(1)
    changed = await store.cancel(["p2", "p0", "missing", "p1", "p2"], pending_only=True)
    assert changed == ["p2", "p1"]
    running, pending = await store.queue()
    assert [job.prompt_id for job in running] == ["p0"] and pending == []
    cancelled = await store.get("p1")
    assert cancelled is not None
    assert cancelled.status is JobStatus.CANCELLED and cancelled.finished_at == clock.now
    assert await store.history_entry("p1") is None
    assert await store.cancel(["p1"], pending_only=True) == []


async def test_cancel_running_too(store: JobStore) -> None:
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    running = await claim_next(store, "lane")
    assert running is not None
    await run_one(store)  # p1 finishes
    assert await store.cancel(["p0", "p1", "p2"], pending_only=False) == ["p0", "p2"]
    assert not await store.finish("p0", running.attempt, result())
    finished = await store.get("p1")
    assert finished is not None and finished.status is JobStatus.SUCCESS


async def test_cancel_all_pending(store: JobStore) -> None:
    for i in range(4):
        await store.submit(new_job(f"p{i}", 10 - i))
    await claim_next(store, "lane")  # p3 (lowest number) runs
    assert await store.cancel_all_pending() == ["p0", "p1", "p2"]
    running, pending = await store.queue()
    assert [job.prompt_id for job in running] == ["p3"] and pending == []
    assert await store.cancel_all_pending() == []


# -- queue and counts -------------------------------------------------------------------


async def test_queue_running_by_start_then_pending(store: JobStore, clock: Clock) -> None:
    for i in range(5):
        await store.submit(new_job(f"p{i}", i))
    claimed = []
    for lane in ("a", "b", "c"):
        clock.advance(1)
        claimed.append(await claim_next(store, lane))
    await store.requeue("p0", 1)
    clock.advance(1)
    await claim_next(store, "d")  # p0 again, started last
    running, pending = await store.queue()
    assert [(job.prompt_id, job.lane) for job in running] == [("p1", "b"), ("p2", "c"), ("p0", "d")]
    assert [job.prompt_id for job in pending] == ["p3", "p4"]
    assert all(job.status is JobStatus.RUNNING for job in running)


async def test_counts(store: JobStore) -> None:
    empty = await store.counts()
    assert empty == dict.fromkeys(JobStatus, 0)
    for i in range(6):
        await store.submit(new_job(f"p{i}", i))
    await run_one(store)
    await run_one(store, result(JobStatus.ERROR))
    await claim_next(store, "lane")
    await store.cancel(["p5"], pending_only=True)
    counts = await store.counts()
    assert counts[JobStatus.SUCCESS] == 1 and counts[JobStatus.ERROR] == 1
    assert counts[JobStatus.RUNNING] == 1 and counts[JobStatus.CANCELLED] == 1
    assert counts[JobStatus.PENDING] == 2 and counts[JobStatus.INTERRUPTED] == 0


# -- the counter ---------------------------------------------------------------------


async def test_next_number_starts_at_zero_and_advances(store: JobStore) -> None:
    assert [await store.next_number() for _ in range(3)] == [0, 1, 2]


async def test_next_number_continues_after_reopen(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    await store.submit(new_job("a", 7))
    await store.submit(new_job("b", -9, front=True))
    await store.submit(new_job("c", 500.0))  # explicit: not the counter's
    await store.submit(new_job("d", 0.5))
    store = await reopen(store)
    try:
        assert await store.next_number() == 10
        assert await store.next_number() == 11
    finally:
        await store.close()


async def test_next_number_never_goes_back_after_pruning(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    for i in range(3):
        number = await store.next_number()
        await store.submit(new_job(f"p{i}", number))
        await run_one(store)
    await store.prune_history(max_entries=0, max_age_seconds=None)
    assert await store.get("p2") is None
    store = await reopen(store)
    try:
        assert await store.next_number() >= 3
    finally:
        await store.close()


async def test_a_counted_job_takes_the_counters_next_value_as_it_is_queued(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    assert await store.next_number() == 0  # a request refused before the store
    plain = await store.submit(new_job("a", None))
    first = await store.submit(new_job("b", None, front=True))
    explicit = await store.submit(new_job("c", 7.5))
    handed = await store.submit(new_job("d", None), claim_for="lane")
    assert [j.number for j in (plain, first, explicit, handed)] == [1, -2, 7.5, 3]
    assert handed.status is JobStatus.RUNNING
    stored = [await store.get(p) for p in "abcd"]
    assert [j.number for j in stored if j is not None] == [1, -2, 7.5, 3]
    assert [j.prompt_id for j in await store.candidates(10)] == ["b", "a", "c"]
    store = await reopen(store)
    try:
        assert await store.next_number() == 4
    finally:
        await store.close()


async def test_counter_survives_a_restart_past_rejected_prompts(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    await store.submit(new_job("p0", await store.next_number()))
    for _ in range(4):  # prompts that failed validation still advance the counter
        await store.next_number()
    store = await reopen(store)
    try:
        assert await store.next_number() == 5
    finally:
        await store.close()


# -- jobs listing ----------------------------------------------------------------------


async def test_jobs_pages_filters_and_counts(store: JobStore, clock: Clock) -> None:
    for i in range(6):
        clock.advance(1 if i != 3 else 0)  # p2 and p3 share a timestamp
        await store.submit(new_job(f"p{i}", 10 - i))
    await run_one(store)  # p5
    await store.cancel(["p4"], pending_only=True)

    page, total = await store.jobs(limit=2)
    assert [job.prompt_id for job in page] == ["p5", "p4"] and total == 6
    page, total = await store.jobs(limit=3, offset=2)
    assert [job.prompt_id for job in page] == ["p3", "p2", "p1"] and total == 6
    page, total = await store.jobs(newest_first=False)
    assert [job.prompt_id for job in page] == [f"p{i}" for i in range(6)]
    page, total = await store.jobs(statuses=[JobStatus.PENDING], newest_first=False, limit=2)
    assert [job.prompt_id for job in page] == ["p0", "p1"] and total == 4
    page, total = await store.jobs(statuses=[JobStatus.SUCCESS, JobStatus.CANCELLED])
    assert [job.prompt_id for job in page] == ["p5", "p4"] and total == 2
    page, total = await store.jobs(statuses=[])
    assert page == [] and total == 0
    page, total = await store.jobs(offset=10)
    assert page == [] and total == 6


# -- concurrency --------------------------------------------------------------------------


async def test_concurrent_submits_and_claims_each_job_once(store: JobStore) -> None:
    ids = [f"p{i}" for i in range(200)]
    claimed: list[Job] = []
    submitted = asyncio.Event()

    async def claimer(lane: str) -> None:
        while True:
            job = await claim_next(store, lane)
            if job is not None:
                claimed.append(job)
            elif submitted.is_set():
                return
            else:
                await asyncio.sleep(0.001)

    async def submit_all() -> None:
        await asyncio.gather(*(store.submit(new_job(pid, i)) for i, pid in enumerate(ids)))
        submitted.set()

    await asyncio.gather(submit_all(), *(claimer(f"lane{n}") for n in range(8)))
    assert sorted(job.prompt_id for job in claimed) == sorted(ids)
    assert all(job.attempt == 1 for job in claimed)
    assert (await store.counts())[JobStatus.RUNNING] == 200


async def test_concurrent_finishes_and_reads(store: JobStore) -> None:
    for i in range(50):
        await store.submit(new_job(f"p{i}", i))
    jobs = [job for job in [await claim_next(store, "lane") for _ in range(50)] if job]

    async def finish(job: Job) -> bool:
        return await store.finish(
            job.prompt_id, job.attempt, result(files=output_files(job.prompt_id))
        )

    outcomes = await asyncio.gather(*(finish(job) for job in jobs), store.history(), store.queue())
    assert all(outcomes[:50])
    entries: list[HistoryEntry] = await store.history()
    assert len(entries) == 50
    assert all(entry.result.files == output_files(entry.job.prompt_id) for entry in entries)


async def test_requeue_reasons_are_kept_per_attempt(store: JobStore) -> None:
    await store.submit(new_job("a"))
    first = await claim_next(store, "backend:x")
    assert first is not None
    assert await store.requeue("a", first.attempt, {"lane": "backend:x", "error": "lost"})
    second = await claim_next(store, "backend:y")
    assert second is not None and second.attempt == 2
    assert await store.requeue("a", second.attempt)  # no reason: nothing noted
    third = await claim_next(store, "backend:z")
    assert third is not None
    assert not await store.requeue("a", 1, {"late": True})  # stale: refused, not noted
    assert await store.attempt_notes("a") == [(1, {"lane": "backend:x", "error": "lost"})]
    assert await store.attempt_notes("unknown") == []


async def test_the_reasons_of_many_jobs_come_in_one_read(store: JobStore) -> None:
    for prompt_id in ("a", "b", "c"):
        await store.submit(new_job(prompt_id))
    # b is given back twice, a once, c never.
    for prompt_id, lane in [("a", "backend:x"), ("b", "backend:x"), ("b", "backend:y")]:
        job = await claim_next(store, lane, only=prompt_id)
        assert job is not None
        assert await store.requeue(prompt_id, job.attempt, {"lane": lane})
    unknown = [f"unknown-{i}" for i in range(1200)]  # more ids than one query binds
    assert await store.attempt_notes_of([*unknown, "c", "b", "a"]) == {
        "a": [(1, {"lane": "backend:x"})],
        "b": [(1, {"lane": "backend:x"}), (2, {"lane": "backend:y"})],
    }
    assert await store.attempt_notes_of([]) == {}


# -- text from outside ---------------------------------------------------------------------

#: Strings a client or a backend may send: NUL (which JSON spells \u0000), control
#: characters, the escape characters of a store, quotes, non-ASCII text.
ODD = "a\x00b\x01c\x01\x02d\\0'\"%_\u2603\U0001f600\x00"


async def test_text_keeps_every_character(store: JobStore) -> None:
    prompt_id, lane = f"id{ODD}", f"lane{ODD}"
    submitted = await store.submit(new_job(prompt_id, client_id=ODD, tenant=ODD))
    assert await store.get(prompt_id) == submitted
    assert await store.get("ida") is None and await store.get(f"id{ODD}x") is None
    assert await store.owned([prompt_id, "other"], ODD) == [prompt_id]
    job = await claim_next(store, lane)
    assert job is not None and job.lane == lane and await store.get(prompt_id) == job
    files = [OutputFile(f"f{ODD}.png", ODD, "output")]
    messages = [[f"kind{ODD}", {"text": ODD}]]
    done = result(files=files, messages=messages, outputs={ODD: {"t": [ODD]}})
    assert await store.finish(prompt_id, job.attempt, done)
    entry = await store.history_entry(prompt_id)
    assert entry is not None and entry.result == done and entry.job.client_id == ODD
    assert [e.job.prompt_id for e in await store.history(tenant=ODD)] == [prompt_id]
    await store.save_backend(ODD, {"name": ODD})
    assert await store.backends() == [{"name": ODD}]
    assert await store.delete_backend(ODD)


async def test_lane_prefixes_match_whole_characters(store: JobStore) -> None:
    for i, lane in enumerate(["x\x01a", "x\x00b", "x\x01", "y"]):
        await store.submit(new_job(f"p{i}", i))
        await claim_next(store, lane)
    assert await store.requeue_lane("x\x01") == ["p0", "p2"]
    assert await store.requeue_lane("x") == ["p1"]


async def test_large_prompts_round_trip(store: JobStore) -> None:
    """Results with much text (decoded off the event loop where a store does that)."""
    big = [
        new_job(f"p{i}", i, prompt={"1": {"class_type": "Text", "inputs": {"t": "x" * 150_000}}})
        for i in range(3)
    ]
    submitted = [await store.submit(job) for job in big]
    _, pending = await store.queue()
    assert pending == submitted
    job = await claim_next(store, "lane", only="p1")
    assert job is not None and job.prompt == big[1].prompt
    messages = [["executed", {"output": {"text": ["y" * 200_000]}}]]
    assert await store.finish("p1", job.attempt, result(messages=messages))
    [entry] = await store.history()
    assert entry.job.prompt == big[1].prompt and entry.result.messages == messages
    page, _ = await store.jobs()
    assert {j.prompt_id for j in page} == {"p0", "p1", "p2"}
