"""Which store a setting names: a PostgreSQL URL, or a SQLite file (the default)."""

from __future__ import annotations

from pathlib import Path

from comfyfleet.store.base import JobStore
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.store.postgres_parts.url import SCHEMES, is_postgres_url
from comfyfleet.store.sqlite import SQLiteStore


def check_store_location(location: str | Path | None) -> str | Path | None:
    """`location` if `open_store` can use it; ValueError for a URL of another kind."""
    if isinstance(location, str) and "://" in location and not is_postgres_url(location):
        scheme = location.partition("://")[0][:20]
        raise ValueError(
            f"unknown store URL scheme {scheme!r}: use "
            f"{' or '.join(f'{name}://...' for name in SCHEMES)}, or a SQLite file path"
        )
    return location


def open_store(
    url_or_path: str | Path | None,
    *,
    default: Path,
    sqlite_synchronous: str = "NORMAL",
    owner: str | None = None,
) -> JobStore:
    """The store `url_or_path` names, to be opened with `await store.open()`:

    - a `postgresql://` or `postgres://` URL: a PostgresStore on that database;
    - None or "": the SQLite file `default` (the data dir's);
    - any other path: a SQLite file there.

    `owner` is the gateway the store claims for (see base.GatewayLeases).

    ValueError for a URL of another scheme (see `check_store_location`).
    """
    check_store_location(url_or_path)
    if isinstance(url_or_path, str) and is_postgres_url(url_or_path):
        return PostgresStore(url_or_path, owner=owner)
    path = Path(url_or_path) if url_or_path else default
    return SQLiteStore(path, synchronous=sqlite_synchronous, owner=owner)
