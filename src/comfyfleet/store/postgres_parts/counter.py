"""ComfyUI's submission counter, kept in a sequence every gateway shares."""

from __future__ import annotations

from typing import Any

from comfyfleet.store.postgres_parts.access import PostgresAccess, Q

#: The counter is a bigint sequence: a stored number past this does not move it.
COUNTER_MAX = 2**62


class PostgresCounter(PostgresAccess):
    """`next_number` from the sequence. A counted submit takes its number in its own
    statement (see insert_job); this is for the requests refused before that."""

    async def next_number(self) -> int:
        """The next value of ComfyUI's submission counter (advances on every call)."""
        number: int = await self._run(lambda db: db.fetchval(Q["next_number"]))
        return number


async def resume_counter(conn: Any) -> None:
    """On open, in its transaction: the counter past every number stored (a database
    whose jobs were numbered before the sequence kept up with them)."""
    counted = await conn.fetchval(Q["max_counted_number"])
    if counted is not None and int(counted) + 1 <= COUNTER_MAX:
        await conn.execute(Q["raise_number"], int(counted) + 1)
