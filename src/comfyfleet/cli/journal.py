"""Where `comfyfleet run` journals paid jobs: a SQLite file kept between runs.

A job done (or left running) by an earlier run is found there by its inputs and
seed, so running the same workflow again pays for nothing it already paid for.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from comfyfleet.fanout import MemoryJournal
from comfyfleet.store.base import RemoteJobJournal
from comfyfleet.store.sqlite import SQLiteStore

JOURNAL_NAME = "run-journal.db"


def user_data_dir(
    env: Mapping[str, str] = os.environ, platform: str = sys.platform, home: Path | None = None
) -> Path:
    """comfyfleet's folder in the user's data folder, as each system names it."""
    home = home or Path.home()
    if platform == "darwin":
        return home / "Library" / "Application Support" / "comfyfleet"
    if platform == "win32":
        local = env.get("LOCALAPPDATA", "")
        return (Path(local) if local else home / "AppData" / "Local") / "comfyfleet"
    data = env.get("XDG_DATA_HOME", "")
    # The XDG rules: a relative path there is invalid, and is ignored.
    base = Path(data) if data and Path(data).is_absolute() else home / ".local" / "share"
    return base / "comfyfleet"


def journal_path(args: argparse.Namespace) -> Path | None:
    """The journal file for a run, or None for a journal in memory (`--no-journal`)."""
    if args.no_journal:
        return None
    if args.journal is not None:
        return Path(args.journal).expanduser().resolve()
    return user_data_dir() / JOURNAL_NAME


@asynccontextmanager
async def open_journal(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[RemoteJobJournal, bool] | None]:
    """(the journal, whether it outlives the run), or None when the file cannot be
    opened (said on stderr)."""
    path = journal_path(args)
    if path is None:
        yield MemoryJournal(), False
        return
    store = SQLiteStore(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        await store.open()
    except Exception as exc:  # a folder we may not write, a file that is not SQLite
        print(
            f"comfyfleet: cannot open the journal {path}: {exc} "
            "(name another with --journal FILE, or use --no-journal)",
            file=sys.stderr,
        )
        yield None
        return
    try:
        yield store, True
    finally:
        await store.close()
