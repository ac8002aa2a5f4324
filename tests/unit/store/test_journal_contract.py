"""The remote-job journal contract, run against every journal: the stores (SQLite,
PostgreSQL) and the in-memory journal of `comfyfleet run`. Only the journal interface is
used."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.fanout.journal import MemoryJournal
from comfyfleet.store.base import JobStore, RemoteJobJournal, StoreError
from tests.unit.store.stores import STORES, Clock, postgres_factory, sqlite_store


@pytest.fixture(params=[*STORES, "memory"])
async def journal(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[RemoteJobJournal]:
    if request.param == "memory":
        yield MemoryJournal(clock)
        return
    if request.param == "sqlite":
        made: JobStore = sqlite_store(tmp_path, clock)
    else:
        made = postgres_factory(request.getfixturevalue("postgres_url"))(tmp_path, clock)
    await made.open()
    yield made
    await made.close()


def new(job_id: str, request_hash: str = "h1", **kw: Any) -> NewRemoteJob:
    return NewRemoteJob(
        id=job_id,
        request_hash=request_hash,
        provider=kw.pop("provider", "bfl"),
        kind=kw.pop("kind", "image"),
        prompt_id=kw.pop("prompt_id", "p1"),
        node_id=kw.pop("node_id", "3"),
        resume=kw.pop("resume", {"base_url": "http://127.0.0.1:1", "key_ref": "env:K"}),
    )


async def test_a_job_is_recorded_submitting_then_running(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    recorded = await journal.record_remote_job(new("j1"))
    assert recorded.state == RemoteJobState.SUBMITTING
    assert recorded.remote_id is None and recorded.created_at == clock.now
    clock.advance(1)
    assert await journal.remote_job_submitted("j1", "task-1", {"polling_url": "http://x/p"})
    found = await journal.remote_job("j1")
    assert found is not None
    assert found.state == RemoteJobState.RUNNING and found.remote_id == "task-1"
    assert found.resume == {"polling_url": "http://x/p"}
    assert found.updated_at == clock.now
    assert await journal.live_remote_jobs() == [found]


async def test_a_recorded_id_is_refused_again(journal: RemoteJobJournal) -> None:
    await journal.record_remote_job(new("j1"))
    with pytest.raises(StoreError):
        await journal.record_remote_job(new("j1"))


async def test_a_request_with_a_live_job_gets_that_job_not_another(
    journal: RemoteJobJournal,
) -> None:
    first = await journal.record_remote_job(new("j1"))
    assert first.owner == journal.owner
    again = await journal.record_remote_job(new("j2"))
    assert (again.id, again.state) == ("j1", RemoteJobState.SUBMITTING)
    assert await journal.remote_job("j2") is None
    assert await journal.release_remote_job("j1")  # nobody else waits on it
    await journal.finish_remote_job("j1", RemoteJobState.CANCELLED)
    assert (await journal.record_remote_job(new("j3"))).id == "j3"


async def test_a_result_is_kept_and_a_final_state_never_changes(
    journal: RemoteJobJournal,
) -> None:
    await journal.record_remote_job(new("j1"))
    await journal.remote_job_submitted("j1", "t1", {})
    data = b"\x89PNG\r\n\x1a\n-image-bytes"
    done = RemoteJobState.SUCCEEDED
    assert await journal.finish_remote_job("j1", done, result=data, result_type="image/png")
    assert not await journal.finish_remote_job("j1", RemoteJobState.CANCELLED)
    assert not await journal.remote_job_submitted("j1", "t2", {})
    found = await journal.remote_job("j1")
    assert found is not None
    assert (found.state, found.result, found.result_type) == (done, data, "image/png")
    assert found.remote_id == "t1" and found.finished_at is not None
    assert await journal.live_remote_jobs() == []
    assert not await journal.finish_remote_job("unknown", RemoteJobState.FAILED)


async def test_finishing_checks_its_arguments(journal: RemoteJobJournal) -> None:
    await journal.record_remote_job(new("j1"))
    with pytest.raises(ValueError):
        await journal.finish_remote_job("j1", RemoteJobState.RUNNING)
    with pytest.raises(ValueError):
        await journal.finish_remote_job("j1", RemoteJobState.FAILED, result=b"x")


async def reusable(journal: RemoteJobJournal, request_hash: str) -> RemoteJob | None:
    """The look-up of one request: a batch of one."""
    return (await journal.reusable_remote_jobs([request_hash])).get(request_hash)


async def test_reusable_prefers_the_newest_success_then_the_newest_job(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    assert await reusable(journal, "h1") is None
    await journal.record_remote_job(new("old-ok"))
    await journal.finish_remote_job("old-ok", RemoteJobState.SUCCEEDED, result=b"one")
    clock.advance(1)
    await journal.record_remote_job(new("failed"))
    error = {"class": "JobFailed", "message": "boom", "status": None}
    await journal.finish_remote_job("failed", RemoteJobState.FAILED, error=error, attempts=3)
    found = await reusable(journal, "h1")
    assert found is not None and found.id == "old-ok" and found.result == b"one"
    await journal.record_remote_job(new("other", "h2"))
    await journal.finish_remote_job("other", RemoteJobState.FAILED, error=error, attempts=3)
    clock.advance(1)
    await journal.record_remote_job(new("live", "h2"))
    newest = await reusable(journal, "h2")
    assert newest is not None and newest.id == "live"
    failed = await journal.remote_job("other")
    assert failed is not None and failed.error == error and failed.attempts == 3


async def test_reusable_jobs_of_many_requests_come_in_one_answer(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    """A batch answers each hash as a batch of one does, and leaves out hashes with no
    job (a request's text may be anything: quotes, JSON, unicode)."""
    assert await journal.reusable_remote_jobs([]) == {}
    odd = "h\"3',[]}é"
    await journal.record_remote_job(new("ok", "h1"))
    await journal.finish_remote_job("ok", RemoteJobState.SUCCEEDED, result=b"png")
    clock.advance(1)
    await journal.record_remote_job(new("later-live", "h1"))  # a success still wins
    await journal.record_remote_job(new("live", "h2"))
    await journal.record_remote_job(new("odd", odd))
    hashes = ["h1", "h2", "missing", odd, "h1"]
    found = await journal.reusable_remote_jobs(hashes)
    assert sorted(found) == sorted(["h1", "h2", odd])
    assert found["h1"].id == "ok" and found["h1"].result == b"png"
    assert found["h2"].id == "live" and found["h2"].result is None
    assert found[odd].id == "odd"
    for request_hash in set(hashes):
        single = await reusable(journal, request_hash)
        assert single == found.get(request_hash)
    many = [f"n{n}" for n in range(1200)]  # more than any one bound list of parameters
    await journal.record_remote_job(new("last", many[-1]))
    assert list(await journal.reusable_remote_jobs(many)) == [many[-1]]


async def test_live_jobs_come_oldest_first_without_results(
    journal: RemoteJobJournal, clock: Clock
) -> None:
    for n in range(3):
        await journal.record_remote_job(new(f"j{n}", f"h{n}"))
        clock.advance(1)
    await journal.finish_remote_job("j1", RemoteJobState.CANCELLED)
    assert [job.id for job in await journal.live_remote_jobs()] == ["j0", "j2"]


async def test_slots_are_assigned_and_unknown_ids_ignored(journal: RemoteJobJournal) -> None:
    await journal.record_remote_job(new("j1"))
    await journal.assign_remote_slots([("j1", 7), ("nope", 2)])
    found = await journal.remote_job("j1")
    assert found is not None and found.slot == 7


async def test_prune_removes_only_old_final_jobs(journal: RemoteJobJournal, clock: Clock) -> None:
    await journal.record_remote_job(new("old", "h1"))
    await journal.finish_remote_job("old", RemoteJobState.SUCCEEDED, result=b"x")
    await journal.record_remote_job(new("live", "h2"))
    clock.advance(100)
    await journal.record_remote_job(new("recent", "h3"))
    await journal.finish_remote_job("recent", RemoteJobState.FAILED)
    assert await journal.prune_remote_jobs(clock.now - 50) == 1
    assert await journal.remote_job("old") is None
    assert await journal.remote_job("live") is not None
    assert await journal.remote_job("recent") is not None


async def test_concurrent_writes_each_land(journal: RemoteJobJournal) -> None:
    await asyncio.gather(*(journal.record_remote_job(new(f"j{n}", f"h{n}")) for n in range(50)))
    await asyncio.gather(*(journal.remote_job_submitted(f"j{n}", f"t{n}", {}) for n in range(50)))
    live = await journal.live_remote_jobs()
    assert sorted(job.remote_id or "" for job in live) == sorted(f"t{n}" for n in range(50))


# -- the stores: the journal survives a reopen ------------------------------------------


async def test_the_journal_survives_reopen(
    store: JobStore, reopen: Callable[[JobStore], Any]
) -> None:
    await store.record_remote_job(new("j1"))
    await store.remote_job_submitted("j1", "t1", {"polling_url": "u"})
    store = await reopen(store)
    try:
        [live] = await store.live_remote_jobs()
        assert (live.id, live.remote_id, live.resume) == ("j1", "t1", {"polling_url": "u"})
    finally:
        await store.close()
