"""The SQLite schema: the migrations of sqlite_schema.sql, each a named block of statements."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from comfyfleet.store.base import StoreError
from comfyfleet.store.sql_blocks import load_blocks


def statements(sql: str) -> Iterator[str]:
    """`sql` one statement at a time (executescript would commit on its own)."""
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip() and not pending.strip().startswith("--"):
        raise StoreError("sqlite_schema.sql has an incomplete statement")


def apply(conn: sqlite3.Connection, version: int) -> None:
    """Run the block that takes a file to `version` (inside the caller's transaction)."""
    for statement in statements(load_blocks("sqlite_schema.sql")[f"migration_{version}"]):
        conn.execute(statement)


def has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    # An upgrade adds a column only where it is missing: a test may reopen a file with
    # its version set back.
    return column in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
