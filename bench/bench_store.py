"""Job store throughput: submit, claim and finish, with 1 and with 64 concurrent callers.

Baseline, measured in the same run: the same operations with group commit
turned off (one transaction per operation, `max_batch=1`). Prints operations
per second for each and the group-commit speed-up at 64 callers.

With `--store postgresql://...`: the PostgreSQL store on that database (in a
schema of its own, dropped afterwards), against the SQLite store with group
commit as the baseline, measured in the same run.

    .venv/bin/python bench/bench_store.py [--jobs N] [--synchronous FULL|NORMAL] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.store.base import JobStore
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.store.postgres_parts.url import redact_url
from comfyfleet.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure

PROMPT = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "b"}},
}
OPS = ("submit", "claim", "finish")


def new_job(index: int) -> NewJob:
    return NewJob(f"job-{index}", index, False, PROMPT, {"client_id": "bench"}, ["3"], "bench")


def result_for(job: Job) -> JobResult:
    messages = [
        ["execution_start", {"prompt_id": job.prompt_id, "timestamp": 1}],
        ["execution_cached", {"nodes": [], "prompt_id": job.prompt_id, "timestamp": 2}],
        ["execution_success", {"prompt_id": job.prompt_id, "timestamp": 3}],
    ]
    image = {"filename": f"{job.prompt_id}.png", "subfolder": "", "type": "output"}
    files = [OutputFile(image["filename"], "", "output")]
    return JobResult(JobStatus.SUCCESS, {"3": {"images": [image]}}, {}, messages, None, files)


async def timed(count: int, callers: int, step: Callable[[int], Awaitable[object]]) -> float:
    """Operations per second running `step(0..count-1)` from `callers` concurrent tasks."""
    next_index = iter(range(count))

    async def caller() -> None:
        for index in next_index:
            await step(index)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return count / (time.perf_counter() - start)


async def measure(store: JobStore, count: int, callers: int) -> dict[str, float]:
    await store.open()
    claimed: list[Job] = []

    # As a scheduler's slots do: each reads the first candidates past those the others
    # are claiming, and claims one no other is claiming.
    taking: set[str] = set()
    taken_ids: set[str] = set()

    async def claim(_: int) -> None:
        after: Job | None = None
        while page := await store.candidates(4 + len(taking), after):
            for job in page:
                if job.prompt_id in taking or job.prompt_id in taken_ids:
                    continue
                taking.add(job.prompt_id)
                try:
                    taken = await store.claim_job(job, "bench")
                finally:
                    taking.discard(job.prompt_id)
                assert taken is not None
                taken_ids.add(taken.prompt_id)
                claimed.append(taken)
                return
            after = page[-1]
        raise AssertionError("no job to claim")

    async def finish(index: int) -> None:
        job = claimed[index]
        assert await store.finish(job.prompt_id, job.attempt, result_for(job))

    try:
        return {
            "submit": await timed(count, callers, lambda i: store.submit(new_job(i))),
            "claim": await timed(count, callers, claim),
            "finish": await timed(count, callers, finish),
        }
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per grouped run")
    parser.add_argument("--synchronous", default="FULL")
    parser.add_argument("--store", metavar="URL", help="a PostgreSQL database to measure")
    args = parser.parse_args()
    if args.store:
        await against_sqlite(args.store, args.jobs, args.synchronous)
        return
    runs: dict[tuple[bool, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for grouped in (True, False):
            for callers in (1, 64):
                # Ungrouped runs pay an fsync per operation: fewer jobs keep it short.
                count = args.jobs if grouped and callers > 1 else max(200, args.jobs // 8)
                path = Path(tmp) / f"{grouped}-{callers}.db"
                batch = 256 if grouped else 1
                store = SQLiteStore(path, synchronous=args.synchronous, max_batch=batch)
                runs[grouped, callers] = await measure(store, count, callers)
    print(f"synchronous={args.synchronous}; operations per second")
    print(f"{'':28}" + "".join(f"{op:>10}" for op in OPS))
    for (grouped, callers), rates in runs.items():
        label = f"{'group commit' if grouped else 'one txn per op'}, {callers} caller(s)"
        print(f"{label:28}" + "".join(f"{rates[op]:>10.0f}" for op in OPS))
    ratios = [runs[True, 64][op] / runs[False, 64][op] for op in OPS]
    print(f"{'speed-up at 64 callers':28}" + "".join(f"{r:>9.1f}x" for r in ratios))
    for op in OPS:
        # Baseline: one transaction per operation, same number of callers.
        for callers in (1, 64):
            with_groups, single = runs[True, callers][op], runs[False, callers][op]
            figure(f"{op}_{callers}_callers", with_groups, "ops/s", single)


async def against_sqlite(url: str, jobs: int, synchronous: str) -> None:
    """PostgresStore on `url` against SQLiteStore (group commit), same counts and callers."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    runs: dict[tuple[str, int], dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for callers in (1, 64):
                count = jobs if callers > 1 else max(200, jobs // 8)
                postgres = PostgresStore(url, schema=f"{schema}_{callers}", pool_size=16)
                runs["postgres", callers] = await measure(postgres, count, callers)
                sqlite = SQLiteStore(Path(tmp) / f"{callers}.db", synchronous=synchronous)
                runs["sqlite", callers] = await measure(sqlite, count, callers)
    finally:
        conn = await asyncpg.connect(url)
        try:
            for callers in (1, 64):
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}_{callers}" CASCADE')
        finally:
            await conn.close()
    print(f"PostgreSQL at {redact_url(url)} against SQLite synchronous={synchronous}")
    print(f"{'operations per second':28}" + "".join(f"{op:>10}" for op in OPS))
    for (kind, callers), rates in runs.items():
        print(f"{f'{kind}, {callers} caller(s)':28}" + "".join(f"{rates[op]:>10.0f}" for op in OPS))
    for op in OPS:
        for callers in (1, 64):
            postgres_rate, sqlite_rate = runs["postgres", callers][op], runs["sqlite", callers][op]
            figure(f"postgres_{op}_{callers}_callers", postgres_rate, "ops/s", sqlite_rate)


if __name__ == "__main__":
    asyncio.run(main())
