"""Filename prefix formatting and save targets."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from comfyfleet.engine.file_counters import FILE_COUNTERS, FileCounters
from comfyfleet.engine.services import Services, using_services
from comfyfleet.nodes.core.saving import SPARE_COUNTERS_FROM, SaveTarget, format_prefix

NOW = datetime(2024, 3, 5, 7, 8, 9)
PROMPT = {
    "5": {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": 832, "height": ["4", 0]},
        "_meta": {"title": "Empty Latent Image"},
    },
    "6": {"class_type": "KSampler", "inputs": {"seed": 42}, "_meta": {"title": "Sampler"}},
}


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("plain", "plain"),
        ("%date:yyyy-MM-dd%/img", "2024-03-05/img"),
        ("%date:yyMMdd_hhmmss%", "240305_070809"),
        ("%date:d.M.yyyy h:m:s%", "5.3.2024 7:8:9"),
        ("%year%%month%%day%-%hour%%minute%%second%", "20240305-070809"),
        ("%width%x%height%", "640x480"),
        ("w%Empty Latent Image.width%", "w832"),
        ("seed_%KSampler.seed%", "seed_42"),
        ("%Empty Latent Image.height%", "%Empty Latent Image.height%"),
        ("%Missing.width%_%batch_num%", "%Missing.width%_%batch_num%"),
    ],
)
def test_format_prefix(prefix: str, expected: str) -> None:
    assert format_prefix(prefix, width=640, height=480, prompt=PROMPT, now=NOW) == expected


def test_target_splits_subfolder_and_name(tmp_path: Path) -> None:
    target = SaveTarget.resolve(tmp_path, "a/./b/../c/name")
    assert target == SaveTarget(tmp_path / "a" / "c", "name", "a/c")


def test_target_counter_starts_after_highest_and_creates_folder(tmp_path: Path) -> None:
    services = Services()
    services.add(FILE_COUNTERS, FileCounters())
    with using_services(services):  # as the engine runs its nodes
        target = SaveTarget.resolve(tmp_path, "new/img")
        assert target.next_counter() == 1
        assert (tmp_path / "new").is_dir()
        for name in ("pic_00002_.png", "pic_00011_.webp", "pic_x.png", "picture_00099_.png"):
            (tmp_path / "new" / name).write_bytes(b"")
        other = SaveTarget.resolve(tmp_path, "new/pic")
        assert other.next_counter() == 12
        # Later calls reserve from the engine's counters (no rescan), in blocks.
        assert other.next_counter(3) == 13
        assert other.next_counter() == 16


def test_each_engine_keeps_its_own_counters(tmp_path: Path) -> None:
    """No counter is kept in the process: another engine (or a save outside any) scans
    the folder, and starts after the files there."""
    target = SaveTarget.resolve(tmp_path, "img")
    first = Services()
    first.add(FILE_COUNTERS, FileCounters())
    with using_services(first):
        assert target.next_counter(5) == 1
    second = Services()
    second.add(FILE_COUNTERS, FileCounters())
    with using_services(second):
        assert target.next_counter() == 1  # nothing was written: the folder is empty
    (tmp_path / "img_00007_.png").write_bytes(b"")
    assert target.next_counter() == 8  # no engine: scanned again
    with using_services(first):
        assert target.next_counter() == 6  # its hint; write_new skips names taken


def test_spare_counters_leave_a_folders_numbering_alone(tmp_path: Path) -> None:
    """Files a gateway named from its spares while the store was away (_1000000005_) do
    not move the folder's own numbering up to them."""
    (tmp_path / "sp").mkdir()
    for name in ("img_00003_.png", f"img_{SPARE_COUNTERS_FROM + 5}_.png"):
        (tmp_path / "sp" / name).write_bytes(b"")
    assert SaveTarget.resolve(tmp_path, "sp/img").next_counter() == 4


def test_files_made_after_the_scan_are_never_replaced(tmp_path: Path) -> None:
    target = SaveTarget.resolve(tmp_path, "late")
    counter = target.next_counter()
    (tmp_path / f"late_{counter:05}_.png").write_bytes(b"theirs")
    filename, used = target.write_new("late", counter, b"ours")
    assert used == counter + 1 and filename == f"late_{counter + 1:05}_.png"
    assert (tmp_path / f"late_{counter:05}_.png").read_bytes() == b"theirs"


def test_target_rejects_escapes(tmp_path: Path) -> None:
    root = tmp_path / "out"
    with pytest.raises(ValueError, match="outside the out folder"):
        SaveTarget.resolve(root, "../out_evil/x")
