"""The page of candidates a gateway keeps for its next claims, with several gateways on
one PostgreSQL store: another gateway's job queued behind the page leaves it kept (no
read per claim); one queued ahead of it is read and taken first."""

from __future__ import annotations

import asyncio
from pathlib import Path

from comfyfleet.domain.jobs import Job, NewJob
from comfyfleet.scheduler.candidates import PAGE, Candidates
from comfyfleet.scheduler.choosing import Verdict
from comfyfleet.scheduler.observers import Observers
from comfyfleet.scheduler.recording import Recorder
from comfyfleet.scheduler.recovery import Recovery
from comfyfleet.scheduler.reservations import Reservations
from comfyfleet.scheduler.retry import RetryPolicy
from comfyfleet.scheduler.runner import Runner
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.scheduler.streams import PromptStreams
from comfyfleet.store.postgres import PostgresStore
from tests.postgres import RoundTrips, schema_for


def new_job(prompt_id: str, number: float, front: bool = False) -> NewJob:
    return NewJob(prompt_id, number, front, {}, {}, [])


async def test_another_gateways_job_behind_the_kept_page_keeps_it(
    postgres_url: str, tmp_path: Path
) -> None:
    schema = schema_for(tmp_path)
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        here = PostgresStore(url, schema=schema, owner="here")
        there = PostgresStore(postgres_url, schema=schema, owner="there")
        await here.open()
        await there.open()
        try:
            observers = Observers()
            state = SchedulerState(here, observers, [])
            candidates = Candidates(state)
            reservations = Reservations(state, candidates)
            streams = PromptStreams(observers)
            recorder = Recorder(state, streams, RetryPolicy(here, 3))
            runner = Runner(state, streams, recorder, reservations.accepted)
            recovery = Recovery(state, runner, reservations, 10.0)
            await here.watch_work(recovery.work_elsewhere)

            async def queued_there(job: NewJob) -> None:
                before = state.pending
                await there.submit(job)
                for _ in range(500):  # until its wake-up came
                    if state.pending > before:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError("no wake-up")

            async def claim() -> tuple[Job | None, int]:
                """The next job claimed here, and the round trips it took."""
                before = proxy.count
                job, _ = await candidates.take_first(
                    lambda _job: Verdict.TAKE, lambda job: here.claim_job(job, "lane")
                )
                return job, proxy.count - before

            for number in range(PAGE + 4):
                await queued_there(new_job(f"p{number:02}", number))
            first, trips = await claim()
            assert first is not None and first.prompt_id == "p00"
            assert trips == 2  # the page read, then the claim

            await queued_there(new_job("later", 100))  # behind the page
            second, trips = await claim()
            assert second is not None and second.prompt_id == "p01"
            assert trips == 1  # the page kept: the claim alone

            await queued_there(new_job("front", 0, front=True))  # ahead of it
            third, trips = await claim()
            assert third is not None and third.prompt_id == "front"
            assert trips == 2  # read again: it goes first
        finally:
            await there.close()
            await here.close()


async def test_slots_claiming_at_once_share_the_pages_they_read(
    postgres_url: str, tmp_path: Path
) -> None:
    """A thousand busy backends set their next jobs aside at once: the slots past the
    first page share each next page's read (and keep it), not one read per slot."""
    schema = schema_for(tmp_path)
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        store = PostgresStore(url, schema=schema, owner="here")
        await store.open()
        try:
            state = SchedulerState(store, Observers(), [])
            candidates = Candidates(state)
            for number in range(4 * PAGE):
                await store.submit(new_job(f"p{number:03}", number))
            state.pending = 4 * PAGE
            before = proxy.count
            taken = await asyncio.gather(
                *(
                    candidates.take_first(
                        lambda _job: Verdict.TAKE, lambda job: store.claim_job(job, "lane")
                    )
                    for _ in range(3 * PAGE)
                )
            )
            claimed = [job.prompt_id for job, _ in taken if job is not None]
            assert sorted(claimed) == [f"p{n:03}" for n in range(3 * PAGE)]
            reads = proxy.count - before - len(claimed)
            assert reads <= 6, reads  # three pages (and a few re-reads), not one per slot
        finally:
            await store.close()
