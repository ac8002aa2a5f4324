"""Keeping a file fetched from a peer: in its folder only, capped, never replacing a
different file."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import blake3
import pytest

from comfyfleet.folders import Folders, UnsafePath
from comfyfleet.peers.blobs import NotTheHash
from comfyfleet.peers.copies import RECORDS
from comfyfleet.peers.keep import TooLarge, keep


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".peer-*")]


async def test_a_fetched_file_is_kept_under_its_name(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path).ensure()
    assert await keep(chunks(b"ab", b"cd"), folders, "output", "sub/dir", "x.png", 10)
    assert (folders.output / "sub" / "dir" / "x.png").read_bytes() == b"abcd"
    assert leftovers(folders.output) == []


async def test_a_name_taken_by_other_bytes_keeps_the_local_file(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path).ensure()
    (folders.input / "x.png").write_bytes(b"local")
    assert not await keep(chunks(b"fetched"), folders, "input", "", "x.png", 100)
    assert (folders.input / "x.png").read_bytes() == b"local"
    # The same bytes: the place holds them, nothing is written.
    assert await keep(chunks(b"lo", b"cal"), folders, "input", "", "x.png", 100)
    assert leftovers(folders.input) == []


async def test_a_link_at_the_name_is_left_alone(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path).ensure()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"secret")
    os.symlink(outside, folders.input / "x.png")
    assert not await keep(chunks(b"secret"), folders, "input", "", "x.png", 100)
    assert outside.read_bytes() == b"secret" and (folders.input / "x.png").is_symlink()


async def test_more_than_the_cap_leaves_nothing(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path).ensure()
    with pytest.raises(TooLarge):
        await keep(chunks(b"x" * 6, b"x" * 6), folders, "temp", "", "big.png", 10)
    assert list(folders.temp.iterdir()) == []


@pytest.mark.parametrize(
    ("subfolder", "name"),
    [("..", "x.png"), ("", "../x.png"), ("a/../..", "x.png"), ("", ".."), ("/etc", "x")],
)
async def test_places_outside_the_folder_are_refused(
    tmp_path: Path, subfolder: str, name: str
) -> None:
    folders = Folders.under(tmp_path / "data").ensure()
    with pytest.raises(UnsafePath):
        await keep(chunks(b"x"), folders, "input", subfolder, name, 10)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []


async def test_a_linked_subfolder_leading_out_is_refused(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path / "data").ensure()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", folders.input / "sub")
    with pytest.raises(UnsafePath):
        await keep(chunks(b"x"), folders, "input", "sub", "x.png", 10)
    assert list((tmp_path / "elsewhere").iterdir()) == []


async def test_an_asset_blob_is_kept_only_with_the_bytes_its_name_promises(
    tmp_path: Path,
) -> None:
    folders = Folders.under(tmp_path).ensure()
    digest = blake3.blake3(b"the asset").hexdigest()
    with pytest.raises(NotTheHash):
        await keep(chunks(b"other bytes"), folders, "input", "assets", f"{digest}.png", 100)
    blobs = folders.input / "assets"
    assert list(blobs.iterdir()) == []  # nothing kept, nothing staged
    assert not (tmp_path / RECORDS).exists()  # nor recorded as a copy
    assert await keep(chunks(b"the ", b"asset"), folders, "input", "assets", f"{digest}.png", 100)
    assert (blobs / f"{digest}.png").read_bytes() == b"the asset"
    # Only blobs are checked: another file under such a name is any file.
    assert await keep(chunks(b"other bytes"), folders, "input", "", f"{digest}.png", 100)
