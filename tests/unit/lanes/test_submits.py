"""A finished prompt's history read lets the submits already under way go first."""

from __future__ import annotations

import asyncio

from comfyfleet.lanes.comfyui import Submits


async def test_a_read_waits_for_the_submits_under_way_only() -> None:
    submits = Submits()
    order: list[str] = []
    release_first = asyncio.Event()

    async def submit(name: str, until: asyncio.Event) -> None:
        with submits.sending():
            await until.wait()
            order.append(name)

    first = asyncio.create_task(submit("first submit", release_first))
    await asyncio.sleep(0)

    async def read_history() -> None:
        await submits.let_pass()
        order.append("history read")

    reading = asyncio.create_task(read_history())
    await asyncio.sleep(0)
    later = asyncio.create_task(submit("later submit", asyncio.Event()))  # never ends
    await asyncio.sleep(0)
    assert order == []
    release_first.set()
    await asyncio.wait_for(reading, timeout=1.0)  # not held up by the later one
    assert order == ["first submit", "history read"]
    later.cancel()
    await asyncio.gather(first, later, return_exceptions=True)


async def test_nothing_under_way_means_no_wait() -> None:
    await asyncio.wait_for(Submits().let_pass(), timeout=0.1)
