"""Job store throughput: submit, claim and finish, with 1 and with 64 concurrent callers.

Baseline, measured in the same run: the same operations with group commit
turned off (one transaction per operation, `max_batch=1`). Prints operations
per second for each and the group-commit speed-up at 64 callers.

    .venv/bin/python bench/bench_store.py [--jobs N] [--synchronous FULL|NORMAL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from comfyfleet.store.records import Job, JobResult, JobStatus, NewJob, OutputFile
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


async def measure(
    path: Path, count: int, callers: int, synchronous: str, max_batch: int
) -> dict[str, float]:
    store = SQLiteStore(path, synchronous=synchronous, max_batch=max_batch)
    await store.open()
    claimed: list[Job] = []

    async def claim(_: int) -> None:
        job = await store.claim("bench")
        assert job is not None
        claimed.append(job)

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
    args = parser.parse_args()
    runs: dict[tuple[bool, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for grouped in (True, False):
            for callers in (1, 64):
                # Ungrouped runs pay an fsync per operation: fewer jobs keep it short.
                count = args.jobs if grouped and callers > 1 else max(200, args.jobs // 8)
                path = Path(tmp) / f"{grouped}-{callers}.db"
                batch = 256 if grouped else 1
                runs[grouped, callers] = await measure(
                    path, count, callers, args.synchronous, batch
                )
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
            grouped, single = runs[True, callers][op], runs[False, callers][op]
            figure(f"{op}_{callers}_callers", grouped, "ops/s", single)


if __name__ == "__main__":
    asyncio.run(main())
