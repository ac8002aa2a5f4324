"""Look-ups of requests about to be sent share reads of the journal (fanout/lookups.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJob, RemoteJobState
from comfyfleet.fanout import lookups
from comfyfleet.fanout.journal import MemoryJournal
from comfyfleet.fanout.lookups import BatchedLookups


class CountedJournal(MemoryJournal):
    """The in-memory journal, noting each batched read; `gate` holds reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def reusable_remote_jobs(self, hashes: Sequence[str]) -> dict[str, RemoteJob]:
        self.reads.append(list(hashes))
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise OSError("the store went away")
        return await super().reusable_remote_jobs(hashes)


async def recorded(journal: MemoryJournal, job_id: str, request_hash: str) -> None:
    job = NewRemoteJob(job_id, request_hash, "bfl", "image", "p1", "3", {})
    await journal.record_remote_job(job)
    await journal.finish_remote_job(job_id, RemoteJobState.SUCCEEDED, result=b"png")


async def test_lookups_asked_while_a_read_is_out_share_the_next_read() -> None:
    journal = CountedJournal()
    await recorded(journal, "done", "h7")
    batched = BatchedLookups(journal)
    journal.gate.clear()
    first = asyncio.ensure_future(batched.reusable("h0"))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(batched.reusable(f"h{n}")) for n in range(1, 30)]
    await asyncio.sleep(0)
    journal.gate.set()
    answers = await asyncio.gather(first, *rest)
    assert journal.reads == [["h0"], [f"h{n}" for n in range(1, 30)]]
    assert [n for n, found in enumerate(answers) if found is not None] == [7]
    assert answers[7] is not None and answers[7].id == "done"


async def test_the_same_request_twice_is_read_once_and_both_answered() -> None:
    journal = CountedJournal()
    await recorded(journal, "done", "h1")
    batched = BatchedLookups(journal)
    both = await asyncio.gather(batched.reusable("h1"), batched.reusable("h1"))
    assert journal.reads == [["h1"]]
    assert [found.id if found else None for found in both] == ["done", "done"]


async def test_a_failed_read_fails_its_lookups_and_the_next_reads_again() -> None:
    journal = CountedJournal()
    batched = BatchedLookups(journal)
    journal.fail_next = True
    failed = await asyncio.gather(
        batched.reusable("a"), batched.reusable("b"), return_exceptions=True
    )
    assert [type(error) for error in failed] == [OSError, OSError]
    assert await batched.reusable("a") is None
    assert journal.reads == [["a", "b"], ["a"]]


async def test_a_cancelled_lookup_leaves_the_others_answered() -> None:
    journal = CountedJournal()
    batched = BatchedLookups(journal)
    journal.gate.clear()
    gone = asyncio.ensure_future(batched.reusable("a"))
    kept = asyncio.ensure_future(batched.reusable("b"))
    await asyncio.sleep(0)
    gone.cancel()
    journal.gate.set()
    assert await kept is None
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_long_queue_is_read_in_bounded_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookups, "MAX_BATCH", 4)
    journal = CountedJournal()
    batched = BatchedLookups(journal)
    answers = await asyncio.gather(*(batched.reusable(f"h{n}") for n in range(10)))
    assert answers == [None] * 10
    assert [len(read) for read in journal.reads] == [4, 4, 2]


async def test_a_reader_cancelled_mid_read_cancels_its_lookups_and_the_next_reads_anew() -> None:
    journal = CountedJournal()
    batched = BatchedLookups(journal)
    journal.gate.clear()
    first = asyncio.ensure_future(batched.reusable("a"))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(batched.reusable("b"))  # waits for the next read
    await asyncio.sleep(0)
    reader = batched._reader
    assert reader is not None
    reader.cancel()  # as when the loop is shut down mid-read
    for lookup in (first, queued):
        with pytest.raises(asyncio.CancelledError):
            await lookup
    journal.gate.set()
    assert await batched.reusable("c") is None
    assert journal.reads == [["a"], ["c"]]
