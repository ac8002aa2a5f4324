"""The client side: prompts that each do one counted side effect and save one image,
submitted at a steady rate through random gateways. A submit that fails (a gateway
killed, paused, or without its store) is sent again, to another gateway, with the same
client-chosen prompt_id: `duplicate_prompt_id` means an earlier send was queued. A
prompt counts as submitted once a gateway has acknowledged it."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

#: Seconds a submit may take before it is sent elsewhere.
SUBMIT_TIMEOUT = 3.0


@dataclass
class Submitted:
    prompt_id: str
    tag: str
    seconds: float
    planned: float  # seconds after the start it is sent
    acked_at: float | None = None  # time.time() of the acknowledgement
    acked_by: str | None = None
    sends: int = 0


def prompt_of(tag: str, seconds: float) -> dict[str, Any]:
    """LedgerAppend(seconds) -> SaveImage("chaos/<tag>"): one ledger line and one file
    per run, the file's pixels naming the run."""
    return {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": tag, "seconds": seconds}},
        "2": {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": f"chaos/{tag}"},
        },
    }


def plan(rng: random.Random, count: int, rate: float, label: str) -> list[Submitted]:
    """`count` prompts, `rate` a second, each sleeping 0.2 to 1.5 s before its effect."""
    return [
        Submitted(
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            f"{label}-{n:04}",
            round(rng.uniform(0.2, 1.5), 2),
            n / rate,
        )
        for n in range(count)
    ]


async def submit_all(
    prompts: list[Submitted], gateways: dict[str, str], rng: random.Random, give_up: float
) -> None:
    """Send each prompt at its planned time; retry until acknowledged or `give_up`
    seconds after its planned time."""
    start = time.monotonic()
    order = [rng.random() for _ in prompts]  # which gateway each send tries first
    async with aiohttp.ClientSession() as session:

        async def one(item: Submitted, first: float) -> None:
            await asyncio.sleep(max(0.0, start + item.planned - time.monotonic()))
            names = sorted(gateways)
            turn = int(first * len(names))
            deadline = time.monotonic() + give_up
            while time.monotonic() < deadline:
                name = names[turn % len(names)]
                turn += 1
                item.sends += 1
                if await send(session, gateways[name], item):
                    item.acked_at, item.acked_by = time.time(), name
                    return
                await asyncio.sleep(min(2.0, 0.1 * item.sends))

        await asyncio.gather(*(one(item, first) for item, first in zip(prompts, order)))


async def send(session: aiohttp.ClientSession, url: str, item: Submitted) -> bool:
    body = {"prompt": prompt_of(item.tag, item.seconds), "prompt_id": item.prompt_id}
    try:
        timeout = aiohttp.ClientTimeout(total=SUBMIT_TIMEOUT)
        async with session.post(url + "/prompt", json=body, timeout=timeout) as reply:
            if reply.status == 200:
                return True
            if reply.status == 400:
                answer = await reply.json(content_type=None)
                error = (answer or {}).get("error") or {}
                return bool(error.get("type") == "duplicate_prompt_id")
            return False
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
