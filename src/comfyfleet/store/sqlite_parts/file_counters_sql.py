"""Output name counters in the SQLite store (`GatewayLeases.reserve_file_counter`).

Gateways keep their files in data dirs of their own, and `/view` finds a file by its
name on any of them: two gateways must never give two files one name. ComfyUI names a
saved file `<prefix>_<counter>_`, the counter one past the highest in the folder; the
store hands out counters for every gateway at once.
"""

from __future__ import annotations

import sqlite3

from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("sqlite_queries.sql")

RESERVE = Q["file_counter_reserve"]


def reserve(conn: sqlite3.Connection, key: str, floor: int, count: int) -> int:
    """The first of `count` counters for `key`, none below `floor` (writer thread)."""
    return int(conn.execute(RESERVE, (key, floor, count)).fetchone()[0])
