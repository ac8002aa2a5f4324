"""Worker tokens: what lets a worker connect, and nothing else (no submit, no history,
no client WebSocket: they are not client tokens and the client routes never see them).

Configured as `[[worker_tokens]]` tables (`name`, `token` or `token_file`, and
`tenant` for workers that run only that tenant's prompts), each naming the worker (or
pool of workers) it admits. A token is compared in constant time and
never logged. A `token_file` is read again while the gateway runs (`reread`): emptied
or removed, its token is revoked; given another token, the old one is.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from comfyfleet.errors import ComfyfleetError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MIN_TOKEN = 16  # characters: a worker token is a secret, not a password to remember


class WorkerTokenError(ComfyfleetError, ValueError):
    """A worker token the config cannot use."""


@dataclass(frozen=True)
class WorkerToken:
    name: str
    token: str = field(repr=False)
    file: Path | None = None  # where it was read from, and is read again
    tenant: str | None = None  # its workers run only this tenant's prompts


def read_token_file(path: Path) -> str:
    """Its first line that is not blank, stripped ("" when there is none); a token is
    short, so only the file's first 4 KiB are read."""
    with path.open(encoding="utf-8") as file:
        lines = file.read(4096).strip().splitlines()
    return lines[0].strip() if lines else ""


def reread(tokens: Sequence[WorkerToken]) -> tuple[WorkerToken, ...]:
    """The tokens as their files say now (blocking: call it in a thread). A file that is
    gone, unreadable or empty revokes its token; the inline ones stay."""
    current = []
    for entry in tokens:
        if entry.file is None:
            current.append(entry)
            continue
        try:
            token = read_token_file(entry.file)
        except (OSError, UnicodeError):
            continue
        if token:
            current.append(replace(entry, token=token))
    return tuple(current)


def checked(tokens: Sequence[WorkerToken]) -> tuple[WorkerToken, ...]:
    names: set[str] = set()
    secrets: set[str] = set()
    for entry in tokens:
        if not NAME.fullmatch(entry.name):
            raise WorkerTokenError(
                f"worker token name {entry.name!r}: 1 to 64 letters, digits, '.', '_' or '-'"
            )
        if len(entry.token) < MIN_TOKEN or not entry.token.isprintable():
            raise WorkerTokenError(
                f"worker token {entry.name}: at least {MIN_TOKEN} printable characters"
            )
        if entry.name in names or entry.token in secrets:
            raise WorkerTokenError(f"worker token {entry.name}: its name or token is used twice")
        names.add(entry.name)
        secrets.add(entry.token)
    return tuple(tokens)


def holder(tokens: Sequence[WorkerToken], presented: str) -> WorkerToken | None:
    """The entry whose token was presented, comparing every one in constant time."""
    found = None
    for entry in tokens:
        if hmac.compare_digest(entry.token.encode(), presented.encode()):
            found = entry
    return found
