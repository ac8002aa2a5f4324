"""FleetNames: output counters every gateway of a store shares, and the spare counters a
gateway takes while the store does not answer (a real SQLite store, closed to stand for
the outage)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from comfyfleet.lanes.outputs import fleet_name
from comfyfleet.nodes.core.saving import SPARE_COUNTERS_FROM
from comfyfleet.peers.names import (
    BLOCK,
    BLOCK_MAX,
    GROW_WITHIN,
    SPARE_BLOCK,
    BlockSizes,
    FleetNames,
)
from comfyfleet.store.sqlite import SQLiteStore


async def fleet_names(tmp_path: Path) -> tuple[SQLiteStore, FleetNames, Path]:
    """A store, its FleetNames for the data dir under `tmp_path`, and its output folder."""
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    output = tmp_path / "data" / "output"
    output.mkdir(parents=True)
    names = FleetNames(store, tmp_path / "data", asyncio.get_running_loop())
    await names.prepare()
    return store, names, output


async def test_counters_come_from_the_store_and_spares_through_an_outage(tmp_path: Path) -> None:
    store, names, output = await fleet_names(tmp_path)
    reserve = names.reserve
    assert await asyncio.to_thread(reserve, output, "img", 1, 1) == 1
    assert await asyncio.to_thread(reserve, output, "img", 2, 1) == 2  # from its block
    assert await asyncio.to_thread(reserve, output / "sub", "img", 1, 1) == 1  # its own key
    temp = tmp_path / "data" / "temp"
    assert await asyncio.to_thread(reserve, temp, "img", 7, 1) == 7  # previews: not shared
    await store.close()  # the store is away: a new folder's save takes spares
    first = await asyncio.to_thread(reserve, output / "new", "img", 1, 2)
    second = await asyncio.to_thread(reserve, output / "new", "img", 1, 1)
    assert first >= SPARE_COUNTERS_FROM and second == first + 2
    await store.open()
    # Back: a folder's numbering goes on below the spares, which no one is given again.
    assert await asyncio.to_thread(reserve, output / "new", "img", 1, 1) == 1
    again = await store.reserve_file_counter("spare counters", SPARE_COUNTERS_FROM, 1)
    assert again >= first + SPARE_BLOCK
    await store.close()


def test_a_folder_saved_into_quickly_reserves_bigger_blocks() -> None:
    sizes = BlockSizes()
    quick = [sizes.next("k", n * GROW_WITHIN / 2) for n in range(8)]
    assert quick == [BLOCK * 2**n for n in range(6)] + [BLOCK_MAX, BLOCK_MAX]
    assert sizes.next("other", 4 * GROW_WITHIN) == BLOCK  # each key its own
    assert sizes.next("k", 10 * GROW_WITHIN) == BLOCK  # after a quiet while


async def test_saves_racing_for_a_block_lose_no_counter(tmp_path: Path) -> None:
    """Eight threads find the blocks used up at once, each reserves one: every block is
    kept and used, lowest first. So the saves that follow fill every gap the race left
    below its highest number (a block lost to the race would leave one for good)."""
    store, names, output = await fleet_names(tmp_path)

    def saves(n: int) -> list[int]:
        return [names.reserve(output, "img", 1, 1) for _ in range(n)]

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(8) as pool:
        numbered = await asyncio.gather(*(loop.run_in_executor(pool, saves, 50) for _ in range(8)))
    handed = [n for numbers in numbered for n in numbers]
    assert len(set(handed)) == 400
    highest = max(handed)
    while (latest := await asyncio.to_thread(names.reserve, output, "img", 1, 1)) < highest:
        handed.append(latest)
    assert sorted(handed) == list(range(1, highest + 1))
    await store.close()


@pytest.mark.parametrize(
    ("backend_name", "prefix", "copied"),
    [
        ("same_00001_.png", "same", "same_00003_.png"),
        ("AnimateDiff_00001.mp4", "AnimateDiff", "AnimateDiff_00003.mp4"),
        ("a_b_00012_.webp", "a_b", "a_b_00003_.webp"),
        ("plain.png", "plain", "plain_00003_.png"),
        ("noext_00001_", "noext", "noext_00003_"),
    ],
)
async def test_a_copied_output_takes_its_counter_from_the_store(
    tmp_path: Path, backend_name: str, prefix: str, copied: str
) -> None:
    """A backend counted its files from its own folder: a copy's counter is the store's,
    from the key a save of the same prefix in that folder uses."""
    store, names, output = await fleet_names(tmp_path)
    assert await asyncio.to_thread(names.reserve, output, prefix, 1, 2) == 1  # two saves
    assert await asyncio.to_thread(fleet_name, output, backend_name, names) == copied
    again = await asyncio.to_thread(fleet_name, output, backend_name, names)
    assert again != copied
    await store.close()
