"""Batches: the group commit of the PostgreSQL store's writes, on its own (a write
function that records what it was given, and can be held or made to refuse)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from comfyfleet.store.postgres_parts.batches import Batches


class Writes:
    """Records each batch; holds them while `gate` is closed; refuses any with "bad"."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, items: Sequence[str]) -> list[str]:
        self.batches.append(list(items))
        await self.gate.wait()
        if "bad" in items:
            raise ValueError("refused")
        return [item.upper() for item in items]


async def until(check: object) -> None:
    async with asyncio.timeout(5):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0)


async def test_a_write_on_a_quiet_store_goes_out_at_once_alone() -> None:
    writes = Writes()
    batches = Batches(writes)
    assert await batches.put("a") == "A"
    assert await batches.put("b") == "B"
    assert writes.batches == [["a"], ["b"]]


async def test_writes_that_come_while_others_are_written_go_out_together() -> None:
    writes = Writes()
    writes.gate.clear()
    batches = Batches(writes, most=4, at_once=2)
    first = []
    for n, item in enumerate(("a", "b"), start=1):
        first.append(asyncio.create_task(batches.put(item)))
        await until(lambda n=n: len(writes.batches) == n)  # under way, alone
    later = [asyncio.create_task(batches.put(str(n))) for n in range(6)]
    await asyncio.sleep(0.01)
    assert len(writes.batches) == 2  # the rest wait for one of them
    writes.gate.set()
    assert await asyncio.gather(*first, *later) == ["A", "B", "0", "1", "2", "3", "4", "5"]
    assert sorted(map(sorted, writes.batches[2:])) == [["0", "1", "2", "3"], ["4", "5"]]


async def one_held() -> tuple[Writes, Batches[str, str], asyncio.Task[str]]:
    """Batches of one write at a time, that write ("x") under way and held."""
    writes = Writes()
    writes.gate.clear()
    batches = Batches(writes, at_once=1)
    held = asyncio.create_task(batches.put("x"))
    await until(lambda: writes.batches)
    return writes, batches, held


async def test_a_write_the_batch_refuses_fails_alone() -> None:
    writes, batches, held = await one_held()
    puts = [asyncio.create_task(batches.put(item)) for item in ("a", "bad", "c")]
    await asyncio.sleep(0)
    writes.gate.set()
    assert await held == "X"
    assert await puts[0] == "A" and await puts[2] == "C"
    with pytest.raises(ValueError, match="refused"):
        await puts[1]
    assert writes.batches[1:] == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


async def test_a_caller_that_stops_waiting_before_its_write_went_out_takes_it_back() -> None:
    writes, batches, held = await one_held()
    kept, dropped = (asyncio.create_task(batches.put(item)) for item in ("a", "b"))
    await asyncio.sleep(0)
    dropped.cancel()
    writes.gate.set()
    assert (await held, await kept) == ("X", "A")
    assert writes.batches == [["x"], ["a"]]
