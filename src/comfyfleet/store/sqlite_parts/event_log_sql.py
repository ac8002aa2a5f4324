"""The prompt event log's SQL: operations the SQLite store runs on its threads.

Appends run on the store's writer thread, in its group commits; reads on a reader
thread. AUTOINCREMENT: an id, once committed, is never handed out again, even after
its row was pruned.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from typing import Any

from comfyfleet.domain.prompt_events import PAGE_FRAME_BYTES, NewPromptEvent, PromptEvent
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts import schema as schema

Q = load_blocks("sqlite_queries.sql")

INSERT = Q["event_log_insert"]
SELECT_AFTER = Q["event_log_select_after"]
SELECT_CLIENT = Q["event_log_select_client"]
PRUNE = Q["event_log_prune"]

Row = tuple[str, str, str, bytes | None]


def add_frames(conn: sqlite3.Connection) -> None:
    """Version 10: binary frames are kept too, their bytes in a column of their own."""
    if not schema.has_column(conn, "event_log", "frame"):
        conn.execute("ALTER TABLE event_log ADD COLUMN frame BLOB")


def encode(events: Sequence[NewPromptEvent]) -> list[Row]:
    """Encode on the caller's thread: the writer stays busy only with SQL."""
    return [(e.prompt_id, e.type, e.json, e.frame) for e in events]


# -- writer thread ------------------------------------------------------------------


def append(
    conn: sqlite3.Connection, rows: list[Row], now: float
) -> tuple[list[int], list[tuple[str, str | None, str | None]]]:
    """The ids of the rows appended, and (prompt_id, tenant, client_id) of each prompt
    appended to (tenant None: no such job), for the wake-ups."""
    conn.executemany(INSERT, [(*row, now) for row in rows])
    # One connection writes, and AUTOINCREMENT takes the largest id ever used plus one:
    # the rows of one statement have consecutive ids, ending at the last one inserted.
    last: int = conn.execute(Q["event_log_last_id"]).fetchone()[0]
    prompts = list(dict.fromkeys(row[0] for row in rows))
    return list(range(last - len(rows) + 1, last + 1)), [_client(conn, p) for p in prompts]


def _client(conn: sqlite3.Connection, prompt_id: str) -> tuple[str, str | None, str | None]:
    row = conn.execute(SELECT_CLIENT, (prompt_id,)).fetchone()
    return (prompt_id, None, None) if row is None else (prompt_id, row[0], row[1])


def prune(conn: sqlite3.Connection, before: float) -> int:
    return conn.execute(PRUNE, (before,)).rowcount


# -- reader threads ------------------------------------------------------------------


def after(conn: sqlite3.Connection, prompt_id: str, after_id: int, limit: int) -> list[PromptEvent]:
    """Up to `limit` events, stopping after the one whose frame brings the page's frame
    bytes to PAGE_FRAME_BYTES (rows are fetched one by one: the rest are never read)."""
    found: list[PromptEvent] = []
    size = 0
    with closing(conn.execute(SELECT_AFTER, (prompt_id, after_id, limit))) as rows:
        for row in rows:
            found.append(_event(prompt_id, row))
            size += len(row[4]) if row[4] is not None else 0
            if size >= PAGE_FRAME_BYTES:
                break  # closing the cursor ends the read
    return found


def _event(prompt_id: str, row: Sequence[Any]) -> PromptEvent:
    frame = None if row[4] is None else bytes(row[4])
    return PromptEvent(row[0], prompt_id, row[1], json.loads(row[2]), row[3], frame)
