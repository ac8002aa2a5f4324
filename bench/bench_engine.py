"""Engine overhead per prompt: a trivial 3-node prompt through validation and execution.

Baseline, measured in the same run: the same three node functions called
directly, without the engine. Prints p50/p99 latency per prompt, the engine's
overhead over the baseline, and throughput with many prompts in flight.

    .venv/bin/python bench/bench_engine.py [--prompts N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders, using_folders
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.core import NODE_CLASS_MAPPINGS as CORE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import percentile


def trivial_prompt(color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "SaveImage",
            "inputs": {"images": ["2", 0], "filename_prefix": "bench"},
        },
    }


def baseline(folders: Folders, count: int) -> list[float]:
    """The node functions alone: what any engine must spend."""
    times = []
    with using_folders(folders):
        for color in range(count):
            start = time.perf_counter()
            (image,) = CORE["EmptyImage"]().generate(64, 64, 1, color)
            (inverted,) = CORE["ImageInvert"]().invert(image)
            CORE["SaveImage"]().save_images(inverted, "baseline", prompt=None, extra_pnginfo=None)
            times.append(time.perf_counter() - start)
    return times


async def sequential(engine: Engine, count: int, offset: int) -> list[float]:
    times = []
    for i in range(count):
        start = time.perf_counter()
        _, result = await engine.run_prompt(trivial_prompt(offset + i))
        times.append(time.perf_counter() - start)
        assert result is not None and result.completed
    return times


async def concurrent(engine: Engine, count: int, offset: int, in_flight: int) -> float:
    gate = asyncio.Semaphore(in_flight)

    async def one(color: int) -> None:
        async with gate:
            _, result = await engine.run_prompt(trivial_prompt(color))
            assert result is not None and result.completed

    start = time.perf_counter()
    await asyncio.gather(*(one(offset + i) for i in range(count)))
    return count / (time.perf_counter() - start)


async def main(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folders = Folders.under(Path(tmp)).ensure()
        engine = Engine(build_registry(), folders)
        await sequential(engine, 20, 10_000_000)  # warm-up
        base = baseline(folders, count)
        seq = await sequential(engine, count, 0)
        rate = await concurrent(engine, count, count, in_flight=16)
        engine.close()
    b50, e50, e99 = percentile(base, 0.5), percentile(seq, 0.5), percentile(seq, 0.99)
    print(f"trivial 3-node prompt (EmptyImage 64x64 -> ImageInvert -> SaveImage), {count} prompts")
    print(f"  baseline (node functions only)   p50 {b50 * 1e3:7.3f} ms")
    print(f"  engine, one at a time            p50 {e50 * 1e3:7.3f} ms   p99 {e99 * 1e3:7.3f} ms")
    overhead = (e50 - b50) * 1e3
    serial = 1 / statistics.mean(base)
    print(f"  engine overhead per prompt       p50 {overhead:7.3f} ms   ratio {e50 / b50:5.2f}x")
    print(f"  engine, 16 in flight             {rate:7.1f} prompts/s  (baseline {serial:.1f}/s)")
    figure("engine_p50", e50 * 1e3, "ms", b50 * 1e3)
    figure("engine_p99", e99 * 1e3, "ms", percentile(base, 0.99) * 1e3)
    figure("engine_overhead_p50", overhead, "ms")
    figure("engine_16_in_flight", rate, "prompts/s", serial)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=500)
    asyncio.run(main(parser.parse_args().prompts))
