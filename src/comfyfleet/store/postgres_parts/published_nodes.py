"""Published node sets in the PostgreSQL store (see seams/published_nodes.py)."""

from __future__ import annotations

from typing import Any

from comfyfleet.store.postgres_parts.access import PostgresAccess, Q
from comfyfleet.store.postgres_text import from_db, to_db


class PostgresPublishedNodes(PostgresAccess):
    """The node sets of lanes only one gateway reaches, by lane."""

    async def publish_nodes(self, lane: str, digest: str, node_set: bytes) -> None:
        now = self._clock()

        async def publish(conn: Any) -> None:
            await conn.execute(Q["node_set_keep"], to_db(digest), node_set, now)
            await conn.execute(
                Q["published_lane_upsert"], to_db(lane), self._owner_db, to_db(digest), now
            )
            await _tidy(conn, now)

        await self._write(publish)

    async def unpublish_nodes(self, lane: str) -> None:
        now = self._clock()

        async def unpublish(conn: Any) -> None:
            await conn.execute(Q["published_lane_delete"], to_db(lane), self._owner_db)
            await _tidy(conn, now)

        await self._write(unpublish)

    async def nodes_elsewhere(self) -> dict[str, str]:
        params = (self._owner_db, self._clock())
        rows = await self._run(lambda db: db.fetch(Q["published_lanes_elsewhere"], *params))
        return {from_db(lane): from_db(digest) for lane, digest in rows}

    async def node_set(self, digest: str) -> bytes | None:
        found = await self._run(lambda db: db.fetchval(Q["node_set_select"], to_db(digest)))
        return None if found is None else bytes(found)


async def _tidy(conn: Any, now: float) -> None:
    """What no live gateway reaches any more goes (a gateway that died left its lanes)."""
    await conn.execute(Q["published_lanes_of_the_dead"], now)
    await conn.execute(Q["node_sets_unused"], now)
