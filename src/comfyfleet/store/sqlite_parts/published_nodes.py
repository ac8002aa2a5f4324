"""Published node sets in the SQLite store (see seams/published_nodes.py)."""

from __future__ import annotations

import functools
import sqlite3

from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts.access import SQLiteAccess

Q = load_blocks("sqlite_queries.sql")


class SQLitePublishedNodes(SQLiteAccess):
    """The node sets of lanes only one gateway reaches, by lane."""

    async def publish_nodes(self, lane: str, digest: str, node_set: bytes) -> None:
        op = functools.partial(
            _publish,
            lane=lane,
            gateway=self.owner,
            digest=digest,
            node_set=node_set,
            now=self._clock(),
        )
        await self._write(op)

    async def unpublish_nodes(self, lane: str) -> None:
        op = functools.partial(_unpublish, lane=lane, gateway=self.owner, now=self._clock())
        await self._write(op)

    async def nodes_elsewhere(self) -> dict[str, str]:
        params = (self.owner, self._clock())
        rows = await self._read(
            lambda conn: conn.execute(Q["published_lanes_elsewhere"], params).fetchall()
        )
        return {lane: digest for lane, digest in rows}

    async def node_set(self, digest: str) -> bytes | None:
        row = await self._read(
            lambda conn: conn.execute(Q["node_set_select"], (digest,)).fetchone()
        )
        return None if row is None else bytes(row[0])


def _publish(
    conn: sqlite3.Connection, lane: str, gateway: str, digest: str, node_set: bytes, now: float
) -> None:
    conn.execute(Q["node_set_keep"], (digest, node_set, now))
    conn.execute(Q["published_lane_upsert"], (lane, gateway, digest, now))
    _tidy(conn, now)


def _unpublish(conn: sqlite3.Connection, lane: str, gateway: str, now: float) -> None:
    conn.execute(Q["published_lane_delete"], (lane, gateway))
    _tidy(conn, now)


def _tidy(conn: sqlite3.Connection, now: float) -> None:
    """What no live gateway reaches any more goes (a gateway that died left its lanes)."""
    conn.execute(Q["published_lanes_of_the_dead"], (now,))
    conn.execute(Q["node_sets_unused"], (now,))
