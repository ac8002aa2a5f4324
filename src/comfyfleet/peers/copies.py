"""Copies fetched from peers, known as such, and their retention.

Each copy `keep` links into a folder has a second link, its record, at
`peer_copies/<type>/<subfolder>/<name>` beside the tenant's input, output and temp
folders. Retention (`prune_copies`, on every gateway) removes a copy once the history
that made it is gone (an output or temp file no job in the store lists any more: the
gateway that ran it pruned it and its files) or once it was fetched longer ago than the
history's age limit. The entry in its folder goes only while it is still the fetched
file (the record's inode), so nothing else is ever deleted; then the record goes. A
record whose copy was removed or replaced meanwhile just goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from comfyfleet.domain.jobs import OutputFile
from comfyfleet.folders import Folders, UnsafePath, plain_name, plain_subfolder, resolve_inside
from comfyfleet.store.base import JobStore
from comfyfleet.tenants import DEFAULT_TENANT, TenantFolders

log = logging.getLogger(__name__)

#: The folder of records, beside a tenant's input, output and temp folders.
RECORDS = "peer_copies"
_KINDS = ("input", "output", "temp")
#: s: a copy this new keeps its place whatever the store says (its prompt may still be
#: running on the peer, its files not recorded yet); a copy removed is fetched again anyway.
GRACE = 300.0
#: Records looked at in one pass; the others wait for the next one.
MAX_PER_PASS = 20_000


def record_path(folders: Folders, kind: str, subfolder: str, name: str) -> str:
    """Where the record of the copy `subfolder/name` of the `kind` folder lives, checked
    to lie in the records folder (UnsafePath otherwise)."""
    plain_name(name)
    plain_subfolder(subfolder)
    relative = posixpath.join(kind, subfolder, name)
    return str(resolve_inside(_records(folders), relative, follow_last=False))


def _records(folders: Folders) -> Path:
    return folders.output.parent / RECORDS


@dataclass(frozen=True)
class Copy:
    """A record found on disk: the copy it names, and when that file was written."""

    file: OutputFile  # name, subfolder, folder type and tenant of the copy
    record: str
    fetched_at: float
    present: bool  # whether the copy's place still holds the recorded file


async def prune_copies(
    store: JobStore, tenants: TenantFolders, max_age: float | None, now: float
) -> int:
    """Remove the copies whose history is gone or that are older than `max_age`
    seconds; returns how many copies were removed (records of gone copies not counted)."""
    found = await asyncio.to_thread(_find, tenants)
    if not found:
        return 0
    # Uploads (input) have no history; a copy fetched moments ago is left a while.
    asked = [
        c.file for c in found if c.present and c.file.type != "input" and c.fetched_at < now - GRACE
    ]
    unlisted = set(asked) - (await store.listed_outputs(asked) if asked else set())
    gone = [
        c
        for c in found
        if not c.present
        or (max_age is not None and c.fetched_at < now - max_age)
        or c.file in unlisted
    ]
    return await asyncio.to_thread(_remove_all, tenants, gone)


def _find(tenants: TenantFolders) -> list[Copy]:
    found: list[Copy] = []
    for tenant, folders in _every_tenant(tenants):
        for kind in _KINDS:
            base = _records(folders) / kind
            for directory, _dirs, names in os.walk(base):
                subfolder = os.path.relpath(directory, base).replace(os.sep, "/")
                subfolder = "" if subfolder == "." else subfolder
                for name in names:
                    copy = _look(folders, OutputFile(name, subfolder, kind, tenant), directory)
                    if copy is not None:
                        found.append(copy)
                    if len(found) >= MAX_PER_PASS:
                        return found
    return found


def _every_tenant(tenants: TenantFolders) -> list[tuple[str, Folders]]:
    every = [(DEFAULT_TENANT, tenants.default)]
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(tenants.root)):
            try:
                every.append((name, tenants.of(name)))
            except ValueError:  # not a tenant's folder
                continue
    return every


def _look(folders: Folders, file: OutputFile, directory: str) -> Copy | None:
    """The record `directory/name` of `file`, None when it is not one (a link, a name
    that is not plain)."""
    try:
        record = record_path(folders, file.type, file.subfolder, file.filename)
        held = os.lstat(record)
    except (UnsafePath, OSError):
        return None
    if not stat.S_ISREG(held.st_mode) or os.path.dirname(record) != os.path.realpath(directory):
        return None
    return Copy(file, record, held.st_mtime, _same_file(folders, file, held))


def _place(folders: Folders, file: OutputFile) -> Path:
    relative = posixpath.join(file.subfolder, file.filename)
    return folders.resolve_inside(file.type, relative, follow_last=False)


def _same_file(folders: Folders, file: OutputFile, held: os.stat_result) -> bool:
    try:
        there = os.lstat(_place(folders, file))
    except (UnsafePath, OSError):
        return False
    return stat.S_ISREG(there.st_mode) and (there.st_dev, there.st_ino) == (
        held.st_dev,
        held.st_ino,
    )


def _remove_all(tenants: TenantFolders, gone: Sequence[Copy]) -> int:
    removed = 0
    for copy in gone:
        folders = tenants.of(copy.file.tenant)
        try:
            record = record_path(folders, copy.file.type, copy.file.subfolder, copy.file.filename)
            held = os.lstat(record)
            # Looked at again: what is there now must still be the fetched file.
            if stat.S_ISREG(held.st_mode) and _same_file(folders, copy.file, held):
                os.unlink(_place(folders, copy.file))
                removed += 1
            os.unlink(record)
        except UnsafePath as exc:
            log.warning("retention left a fetched copy alone: %s", exc)
        except OSError:
            continue
    return removed
