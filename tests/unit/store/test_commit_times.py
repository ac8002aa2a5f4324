"""Every store times its writes until committed (what `comfyfleet_store_commit_seconds`
reports): each committed write counts once, a refused one not at all, reads never."""

from __future__ import annotations

import pytest

from comfyfleet.store.base import DuplicateJob, JobStore
from comfyfleet.store.commit_times import BOUNDS, CommitTimes
from tests.unit.store.job_helpers import new_job, result
from tests.unit.store.stores import claim_next


async def test_each_committed_write_counts_once(store: JobStore) -> None:
    before = store.commit_times.tally()
    await store.submit(new_job("a"))
    job = await claim_next(store, "lane")
    assert job is not None
    assert await store.finish(job.prompt_id, job.attempt, result())
    after = store.commit_times.tally()
    assert after.count == before.count + 3
    assert after.total_seconds > before.total_seconds

    await store.counts()
    await store.history()
    assert store.commit_times.tally().count == after.count  # reads are not commits
    with pytest.raises(DuplicateJob):
        await store.submit(new_job("a"))
    assert store.commit_times.tally().count == after.count  # refused: nothing committed


def test_the_tally_puts_each_time_under_its_bound() -> None:
    times = CommitTimes()
    for seconds in (0.0001, BOUNDS[0], 0.003, 100.0):
        times.add(seconds)
    tally = times.tally()
    assert tally.counts[0] == 2  # a bound is inclusive, as Prometheus's `le`
    assert tally.counts[BOUNDS.index(0.005)] == 1
    assert tally.counts[-1] == 1  # above every bound: +Inf
    assert tally.count == 4 and abs(tally.total_seconds - 100.0036) < 1e-9
