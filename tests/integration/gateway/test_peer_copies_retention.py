"""Retention of the copies a gateway fetched from its peers: two in-process gateways on
one PostgreSQL store, A running every prompt, B only viewing A's files. Once A's
retention has pruned a prompt and its files, B's removes the copy it fetched, and only
that file; copies older than the history's age limit go too."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from comfyfleet.peers.copies import GRACE, RECORDS
from tests.integration.gateway.wire import Served, save_prompt, serve

pytestmark = pytest.mark.timeout(120)


@asynccontextmanager
async def two_gateways(
    tmp_path: Path, url: str, **b_settings: Any
) -> AsyncIterator[tuple[Served, Served]]:
    """A keeps one history entry and runs every prompt; B has no slot."""
    async with (
        serve(tmp_path / "a", local_slots=1, store=url, history_max_entries=1) as a,
        serve(tmp_path / "b", local_slots=0, store=url, **b_settings) as b,
    ):
        yield a, b


async def saved(a: Served, color: int, prefix: str) -> dict[str, str]:
    sock = await a.connect()
    (prompt_id,) = await a.run_in_turn(sock, [save_prompt(color, prefix)])
    (image,) = (await a.history_entry(prompt_id))["outputs"]["2"]["images"]
    return {key: image[key] for key in ("filename", "subfolder", "type")}


async def viewed(b: Served, file: dict[str, str]) -> Path:
    """View `file` through B (fetched from A); the copy B keeps."""
    async with b.session.get(f"{b.url}/view?{urlencode(file)}") as reply:
        assert reply.status == 200
        body = await reply.read()
    copy = b.data_dir / file["type"] / file["subfolder"] / file["filename"]
    assert copy.read_bytes() == body
    return copy


def age(path: Path, seconds: float) -> None:
    """As if the copy was fetched `seconds` ago (the record is the same file)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def records(b: Served) -> list[Path]:
    return sorted(p for p in (b.data_dir / RECORDS).rglob("*") if p.is_file())


async def test_a_copy_goes_once_the_gateway_that_ran_its_prompt_pruned_it(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        first = await saved(a, 1, "pruned")
        copy = await viewed(b, first)
        assert copy.is_file()
        assert records(b) == [b.data_dir / RECORDS / "output" / first["filename"]]
        age(copy, GRACE + 60)
        own = b.data_dir / "output" / "own_00001_.png"  # a file of B's own, never fetched
        own.write_bytes(b"B's own")
        assert await b.gateway.prune_once() == 0  # its prompt is still in the history
        assert copy.is_file()

        await saved(a, 2, "kept")  # A keeps only this one's entry
        assert await a.gateway.prune_once() == 1
        assert not (a.data_dir / "output" / first["filename"]).exists()

        assert await b.gateway.prune_once() == 1
        assert not copy.exists()
        assert records(b) == []
        assert own.read_bytes() == b"B's own"


async def test_only_the_fetched_file_goes_and_new_copies_wait(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database) as (a, b):
        replaced_file = await saved(a, 3, "replaced")
        fresh_file = await saved(a, 4, "fresh")  # prunes the first entry on A's next pass
        replaced = await viewed(b, replaced_file)
        fresh = await viewed(b, fresh_file)
        age(replaced, GRACE + 60)
        # Someone put another file in the copy's place: it is not the fetched copy.
        replaced.unlink()
        replaced.write_bytes(b"another file")
        assert await a.gateway.prune_once() == 1
        await saved(a, 5, "newest")
        assert await a.gateway.prune_once() == 1  # fresh's entry and A's file go
        assert await b.gateway.prune_once() == 0
        assert replaced.read_bytes() == b"another file"  # left alone, its record gone
        assert fresh.is_file()  # fetched moments ago: it waits for the grace
        assert records(b) == [b.data_dir / RECORDS / "output" / fresh_file["filename"]]


async def test_copies_older_than_the_history_age_limit_go(
    tmp_path: Path, postgres_database: str
) -> None:
    async with two_gateways(tmp_path, postgres_database, history_max_age=3600.0) as (a, b):
        old_file = await saved(a, 6, "old")
        new_file = await saved(a, 7, "new")
        old = await viewed(b, old_file)
        new = await viewed(b, new_file)
        age(old, 7200)
        assert await b.gateway.prune_once() == 1
        assert not old.exists() and new.is_file()
