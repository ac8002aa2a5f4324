"""Fleet keys in the SQLite store: secrets the gateways sharing a store agree on.

The first gateway to ask for a key stores its candidate; every later one reads that.
The key never leaves the store but to the gateway that asked (see peers/signing.py).
"""

from __future__ import annotations

import sqlite3

from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("sqlite_queries.sql")

KEEP_FIRST = Q["fleet_key_keep_first"]
SELECT_KEY = Q["fleet_key_select_key"]


def keep(conn: sqlite3.Connection, name: str, candidate: bytes, now: float) -> bytes:
    """The key stored under `name`, `candidate` stored first when there is none (writer
    thread, one transaction)."""
    conn.execute(KEEP_FIRST, (name, candidate, now))
    row = conn.execute(SELECT_KEY, (name,)).fetchone()
    return bytes(row[0])
