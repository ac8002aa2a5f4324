"""Prompt validation time against prompt size, with real built-in nodes.

Prompts of about 1,000 nodes:
  - chain:   EmptyImage -> 998 x ImageInvert -> SaveImage
  - fan-in:  500 EmptyImage -> a binary tree of 499 ImageBatch -> SaveImage
  - outputs: EmptyImage -> 499 x (ImageInvert -> PreviewImage), 499 output nodes
  - invalid: the chain with width 0 on the EmptyImage (the error path)
  - cycle:   the chain closed into a 999-node cycle (the static check rejects it)

Baseline, measured in the same run: the same shape at 10 nodes, times 100. A ratio
near 1 means validation time is linear in the number of nodes.

    .venv/bin/python bench/bench_validation.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.validation import validate_prompt
from comfyfleet.folders import Folders, using_folders
from comfyfleet.nodes import build_registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure

Prompt = dict[str, Any]


def node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {"class_type": class_type, "inputs": inputs}


def empty_image(width: int = 64) -> dict[str, Any]:
    return node("EmptyImage", width=width, height=64, batch_size=1, color=0)


def chain(size: int) -> Prompt:
    prompt: Prompt = {"1": empty_image()}
    for i in range(2, size):
        prompt[str(i)] = node("ImageInvert", image=[str(i - 1), 0])
    prompt[str(size)] = node("SaveImage", images=[str(size - 1), 0], filename_prefix="bench")
    return prompt


def fan_in(size: int) -> Prompt:
    leaves = size // 2
    prompt: Prompt = {f"e{i}": empty_image() for i in range(leaves)}
    level = list(prompt)
    count = 0
    while len(level) > 1:
        merged = []
        for left, right in zip(level[::2], level[1::2]):
            count += 1
            prompt[f"b{count}"] = node("ImageBatch", image1=[left, 0], image2=[right, 0])
            merged.append(f"b{count}")
        level = merged + level[len(level) - len(level) % 2 :]
    prompt["save"] = node("SaveImage", images=[level[0], 0], filename_prefix="bench")
    return prompt


def many_outputs(size: int) -> Prompt:
    prompt: Prompt = {"1": empty_image()}
    for i in range((size - 1) // 2):
        prompt[f"i{i}"] = node("ImageInvert", image=["1", 0])
        prompt[f"p{i}"] = node("PreviewImage", images=[f"i{i}", 0])
    return prompt


def invalid_chain(size: int) -> Prompt:
    prompt = chain(size)
    prompt["1"] = empty_image(width=0)
    return prompt


def cycle(size: int) -> Prompt:
    prompt = chain(size)
    prompt["1"] = node("ImageInvert", image=[str(size - 1), 0])
    return prompt


SHAPES: dict[str, Callable[[int], Prompt]] = {
    "chain": chain,
    "fan-in": fan_in,
    "outputs": many_outputs,
    "invalid": invalid_chain,
    "cycle": cycle,
}


async def timings(registry: NodeRegistry, prompt: Prompt, runs: int) -> list[float]:
    """Seconds per validate_prompt call, after one warm-up call."""
    expect_ok = (await validate_prompt(registry, prompt)).ok
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = await validate_prompt(registry, prompt)
        times.append(time.perf_counter() - start)
        assert result.ok == expect_ok
    return times


async def main(runs: int) -> None:
    registry = build_registry()
    print(f"validate_prompt, best and median of {runs} runs, in ms")
    print(f"{'shape':<8} {'nodes':>6} {'best':>8} {'median':>8} {'10-node x100':>13} {'ratio':>6}")
    for name, build in SHAPES.items():
        small = await timings(registry, build(10), runs * 5)
        prompt = build(1000)
        large = await timings(registry, prompt, runs)
        baseline = min(small) * 100
        print(
            f"{name:<8} {len(prompt):>6} {min(large) * 1e3:>8.2f} "
            f"{statistics.median(large) * 1e3:>8.2f} {baseline * 1e3:>13.2f} "
            f"{min(large) / baseline:>6.2f}"
        )
        figure(f"{name}_1000_nodes_best", min(large) * 1e3, "ms", baseline * 1e3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    # LoadImage lists the input folder; keep the run away from the working directory.
    with tempfile.TemporaryDirectory() as root, using_folders(Folders.under(root).ensure()):
        asyncio.run(main(args.runs))
