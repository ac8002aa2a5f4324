"""Output name counters in the SQLite store (`GatewayLeases.reserve_file_counter`).

Gateways keep their files in data dirs of their own, and `/view` finds a file by its
name on any of them: two gateways must never give two files one name. ComfyUI names a
saved file `<prefix>_<counter>_`, the counter one past the highest in the folder; the
store hands out counters for every gateway at once.
"""

from __future__ import annotations

import sqlite3

#: Version 13 adds the table; IF NOT EXISTS because a fresh file already has it.
RESERVE = """
INSERT INTO file_counters (key, next) VALUES (?1, ?2 + ?3)
ON CONFLICT (key) DO UPDATE SET next = max(file_counters.next, ?2) + ?3
RETURNING next - ?3
"""


def reserve(conn: sqlite3.Connection, key: str, floor: int, count: int) -> int:
    """The first of `count` counters for `key`, none below `floor` (writer thread)."""
    return int(conn.execute(RESERVE, (key, floor, count)).fetchone()[0])
