"""Instructions per prompt of the built-in engine and per job of the SQLite store,
counted by valgrind's callgrind: a figure that holds still on a loaded machine, for
comparing two commits of the code (wall-clock figures swing by 10-80 % here).

    .venv/bin/python bench/instructions.py engine 300   # one run; prints instructions
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python bench/instructions.py engine 0    # the start-up alone

Run each workload with N and with 0 under callgrind: (total(N) - total(0)) / N is
the cost of one prompt (engine: a trivial 3-node prompt, 16 in flight) or one job
(store: submit, claim and finish, 64 callers, synchronous=OFF so no fsync is timed).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_store
from bench_engine import trivial_prompt
from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.store.sqlite import SQLiteStore


async def engine(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Engine(build_registry(), Folders.under(Path(tmp)))
        for color in range(20):  # warm: imports, caches, the worker threads
            await run.run_prompt(trivial_prompt(color))
        gate = asyncio.Semaphore(16)

        async def one(color: int) -> None:
            async with gate:
                await run.run_prompt(trivial_prompt(color))

        await asyncio.gather(*(one(1000 + i) for i in range(count)))
        run.close()


async def store(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        opened = SQLiteStore(Path(tmp) / "jobs.db", synchronous="OFF")
        if count:
            await bench_store.measure(opened, count, 64)
        else:
            await opened.open()
            await opened.close()


if __name__ == "__main__":
    workload = {"engine": engine, "store": store}[sys.argv[1]]
    asyncio.run(workload(int(sys.argv[2])))
