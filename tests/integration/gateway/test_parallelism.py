"""Slots are real parallelism: N slots run N prompts at once, one slot runs them in turn."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.integration.gateway.wire import save_prompt, serve, sleep_prompt


async def test_sixteen_one_second_sleeps_take_about_a_second_on_sixteen_slots(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, local_slots=16) as served:
        sock = await served.connect()
        started = time.monotonic()
        ids = await asyncio.gather(
            *(served.submit(sleep_prompt(1.0, color), sock.client_id) for color in range(16))
        )
        await asyncio.gather(*(sock.done(prompt_id) for prompt_id in ids))
        elapsed = time.monotonic() - started

        assert 1.0 <= elapsed < 2.5, elapsed
        types = [(f.type, f.prompt_id) for f in sock.frames]
        first_success = next(i for i, (kind, _) in enumerate(types) if kind == "execution_success")
        starts = [i for i, (kind, _) in enumerate(types) if kind == "execution_start"]
        assert len(starts) == 16 and max(starts) < first_success  # all 16 ran at once


async def test_one_slot_runs_prompts_one_after_the_other(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        started = time.monotonic()
        first, second = [
            await served.submit(sleep_prompt(0.5, color), sock.client_id) for color in (1, 2)
        ]
        await sock.done(second)
        elapsed = time.monotonic() - started

        assert elapsed >= 1.0, elapsed
        first_done = await sock.done(first)
        second_start = await sock.wait_for(
            lambda f: f.type == "execution_start" and f.prompt_id == second, what="second start"
        )
        assert first_done < second_start


async def test_one_slot_sends_each_prompts_frames_as_one_block(tmp_path: Path) -> None:
    """Prompts started back to back on one slot: a client sees one prompt's done signal
    before the next prompt's first frame, as from ComfyUI."""
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        ids = [
            await served.submit(save_prompt(color, f"block{color}"), sock.client_id)
            for color in range(20)
        ]
        await sock.done(ids[-1])
        order = [f.prompt_id for f in sock.frames if f.type != "status" and f.prompt_id]
        blocks = [p for i, p in enumerate(order) if i == 0 or order[i - 1] != p]
        assert blocks == ids  # one contiguous block per prompt, in submission order
        for prompt_id in ids:
            frames = sock.of_prompt(prompt_id)
            assert frames[-1].is_done(prompt_id), [f.describe() for f in frames]
