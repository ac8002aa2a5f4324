"""Backend ownership in the SQLite store (the `BackendOwners` verbs; see store/base.py).

A backend is owned by the gateway named in its row while that gateway's lease holds:
the lease of the gateways table, renewed by the one heartbeat, so a dead gateway's
backends are free as soon as its jobs are orphaned. A row outlives its owner: the
backend's client id stays the same for every gateway that owns it later.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from comfyfleet.domain.gateways import BackendOwner
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("sqlite_queries.sql")

LEASE_HOLDS = Q["backend_owner_lease_holds"]
SELECT_ONE = Q["backend_owner_select_one"]
SELECT_ALL = Q["backend_owner_select_all"]
INSERT = Q["backend_owner_insert"]
TAKE = Q["backend_owner_take"]
RELEASE = Q["backend_owner_release"]
RELEASE_ALL = Q["backend_owner_release_all"]
FORGET = Q["backend_owner_forget"]


def _row(row: Sequence[Any]) -> BackendOwner:
    return BackendOwner(row[0], row[1], row[2], row[3])


def claim(
    conn: sqlite3.Connection,
    owner: str,
    instance: str,
    offered: list[tuple[str, str]],
    limit: int | None,
    now: float,
    take_lapsed: bool = True,
) -> list[BackendOwner]:
    """Runs on the writer thread, in one transaction: no other claim interleaves."""
    leased = conn.execute(LEASE_HOLDS, (owner, instance, now)).fetchone() is not None
    taken = 0
    held: list[BackendOwner] = []
    for backend, client_id in offered:
        row = conn.execute(SELECT_ONE, (now, backend)).fetchone()
        current = None if row is None else _row(row)
        if current is not None and row[4] == owner:
            # Still this gateway's: kept even while its own lease is out (it renews it
            # soon), as long as no other gateway has taken the backend meanwhile.
            held.append(replace(current, owner=owner))
            continue
        free = current is None or row[4] is None or (take_lapsed and current.owner is None)
        if not (leased and free and (limit is None or taken < limit)):
            continue
        if current is None:
            conn.execute(INSERT, (backend, client_id, owner, now))
            held.append(BackendOwner(backend, client_id, owner, now))
        else:
            conn.execute(TAKE, (owner, now, backend))
            held.append(BackendOwner(backend, current.client_id, owner, now))
        taken += 1
    return held


def release(conn: sqlite3.Connection, owner: str, names: Sequence[str] | None) -> None:
    if names is None:
        conn.execute(RELEASE_ALL, (owner,))
    else:
        conn.executemany(RELEASE, [(owner, name) for name in names])


def owners(conn: sqlite3.Connection, now: float) -> list[BackendOwner]:
    return [_row(row) for row in conn.execute(SELECT_ALL, (now,))]
