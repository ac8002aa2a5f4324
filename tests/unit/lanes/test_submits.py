"""A finished prompt's history read lets the submits already under way go first."""

from __future__ import annotations

import asyncio

from comfyfleet.lanes.submits import Submits


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


async def test_reads_wait_for_their_submits_in_any_order_of_ending() -> None:
    # A thousand backends finishing together: each history read waits for the submits
    # under way when it began, which end in any order.
    submits = Submits()
    gates = [asyncio.Event() for _ in range(1_000)]
    ended: set[int] = set()

    async def submit(number: int) -> None:
        with submits.sending():
            await gates[number].wait()
        ended.add(number)

    async def read(after: int) -> set[int]:
        await submits.let_pass(timeout=30)
        return set(ended)

    sending = []
    reads = []
    for number in range(1_000):
        sending.append(asyncio.create_task(submit(number)))
        await asyncio.sleep(0)
        reads.append(asyncio.create_task(read(number)))
    for number in reversed(range(1_000)):  # the newest end first
        gates[number].set()
        await asyncio.sleep(0)
    seen = await asyncio.gather(*reads)
    for number, ended_then in enumerate(seen):
        assert set(range(number + 1)) <= ended_then  # all that were under way, ended
    await asyncio.gather(*sending)
