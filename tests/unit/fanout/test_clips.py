"""The clip folder: a file lives as long as its value, a process's folder as long as the
process, and what a killed process left is removed by the next one."""

from __future__ import annotations

import fcntl
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from comfyfleet.fanout.clips import LIVE_PREFIX, LOCK_NAME, ClipFolder, sweep


class Value:
    """Something a clip belongs to (a VideoFile, in the fan-out)."""


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_clip_is_deleted_when_its_value_is_released(tmp_path: Path) -> None:
    clips = ClipFolder(tmp_path)
    value = Value()
    path = clips.write(b"frames", "mp4")
    clips.tie(value, path)
    assert path.read_bytes() == b"frames"
    assert path.parent.name.startswith(LIVE_PREFIX) and path.parent.parent == tmp_path
    del value
    gc.collect()
    assert not path.exists()
    assert files(tmp_path) == [f"{path.parent.name}/{LOCK_NAME}"]  # the folder stays


def left_folder(root: Path, name: str) -> Path:
    """The folder of a process that is gone: its lock file is free."""
    folder = root / f"{LIVE_PREFIX}{name}"
    folder.mkdir(parents=True)
    (folder / LOCK_NAME).touch()
    (folder / "clip.mp4").write_bytes(b"x")
    return folder


def test_the_folders_of_gone_processes_are_swept_not_the_living_ones(tmp_path: Path) -> None:
    gone = left_folder(tmp_path, "gone")
    alive = left_folder(tmp_path, "alive")
    fd = os.open(alive / LOCK_NAME, os.O_RDWR)  # held, as its process holds it
    fcntl.flock(fd, fcntl.LOCK_EX)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    left_folder(outside, "target")
    (tmp_path / f"{LIVE_PREFIX}link").symlink_to(outside / f"{LIVE_PREFIX}target")
    try:
        clips = ClipFolder(tmp_path)
        mine = clips.write(b"mine", "mp4").parent
        assert not gone.exists()
        assert (alive / "clip.mp4").exists() and (mine / LOCK_NAME).exists()
        assert files(outside) == [
            f"{LIVE_PREFIX}target/{LOCK_NAME}",
            f"{LIVE_PREFIX}target/clip.mp4",
        ]
        # This process's own folder is locked too: another sweep leaves it.
        assert sweep(tmp_path) == 0 and mine.exists()
    finally:
        os.close(fd)


def test_a_sweep_removes_a_bounded_number_of_folders(tmp_path: Path) -> None:
    for n in range(5):
        left_folder(tmp_path, str(n))
    assert sweep(tmp_path, limit=2) == 2
    assert len(list(tmp_path.iterdir())) == 3
    assert sweep(tmp_path) == 3 and not list(tmp_path.iterdir())


KEEP = """
import os, sys
from pathlib import Path
from comfyfleet.fanout.clips import ClipFolder

class Value: pass

clips = ClipFolder(Path(sys.argv[1]))
held = Value()
path = clips.write(b"frames", "mp4")
clips.tie(held, path)
print(path, flush=True)
if sys.argv[2] == "killed":
    os._exit(0)  # no clean-up runs, as when the process is killed
"""


def keep_in_a_process(root: Path, how: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KEEP), str(root), how],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(done.stdout.strip())


def test_a_process_leaves_nothing_at_exit_and_a_killed_ones_folder_goes_next_start(
    tmp_path: Path,
) -> None:
    path = keep_in_a_process(tmp_path, "exits")
    assert path.parent.parent == tmp_path and files(tmp_path) == []
    path = keep_in_a_process(tmp_path, "killed")
    assert path.exists()
    ClipFolder(tmp_path).folder()
    assert not path.parent.exists()
