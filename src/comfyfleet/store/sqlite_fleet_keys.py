"""Fleet keys in the SQLite store: secrets the gateways sharing a store agree on.

The first gateway to ask for a key stores its candidate; every later one reads that.
The key never leaves the store but to the gateway that asked (see peers/signing.py).
"""

from __future__ import annotations

import sqlite3

#: Version 9 adds the table; IF NOT EXISTS because a fresh file already has it.
KEEP_FIRST = """
INSERT INTO fleet_keys (name, key, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING
"""
SELECT_KEY = "SELECT key FROM fleet_keys WHERE name = ?"


def keep(conn: sqlite3.Connection, name: str, candidate: bytes, now: float) -> bytes:
    """The key stored under `name`, `candidate` stored first when there is none (writer
    thread, one transaction)."""
    conn.execute(KEEP_FIRST, (name, candidate, now))
    row = conn.execute(SELECT_KEY, (name,)).fetchone()
    return bytes(row[0])
