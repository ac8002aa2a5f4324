"""What the SQLite store counts of its queue (see `JobQueue`): each tenant's jobs, for
fair share, and where a pending job stands, for v2's queue_position (two ranges of the
dispatch index counted, never the queue read)."""

from __future__ import annotations

import functools
import math
import sqlite3

from comfyfleet.domain.shares import TenantCounts
from comfyfleet.store.base import MAX_QUEUE_POSITION
from comfyfleet.store.sql_blocks import load_blocks
from comfyfleet.store.sqlite_parts.access import SQLiteAccess

Q = load_blocks("sqlite_queries.sql")
TENANT_COUNTS = Q["tenant_counts"]
PENDING_KEY = Q["pending_key"]
COUNT_AHEAD = Q["count_ahead"]
COUNT_AHEAD_OF = Q["count_ahead_of"]


class SQLiteQueueReads(SQLiteAccess):
    """Counts of the queue: per tenant, and ahead of a pending job."""

    async def tenant_counts(self) -> dict[str, TenantCounts]:
        """Each tenant's pending (claimable) and running jobs, and its oldest claimable."""
        rows = await self._read(lambda conn: conn.execute(TENANT_COUNTS).fetchall())
        return {
            tenant: TenantCounts(int(pending), int(running), math.inf if oldest is None else oldest)
            for tenant, pending, running, oldest in rows
        }

    async def queue_position(self, prompt_id: str, *, own_tenant: bool = False) -> int | None:
        """1 + the pending jobs ahead of a pending job (its tenant's only with
        `own_tenant`), at most MAX_QUEUE_POSITION; None when it is not pending."""
        op = functools.partial(_queue_position, prompt_id=prompt_id, own_tenant=own_tenant)
        return await self._read(op)


def _queue_position(conn: sqlite3.Connection, prompt_id: str, own_tenant: bool) -> int | None:
    key = conn.execute(PENDING_KEY, (prompt_id,)).fetchone()
    if key is None:
        return None
    front, order, seq, tenant = key
    cap = MAX_QUEUE_POSITION - 1
    if own_tenant:
        (ahead,) = conn.execute(COUNT_AHEAD_OF, (front, order, seq, cap, tenant)).fetchone()
    else:
        (ahead,) = conn.execute(COUNT_AHEAD, (front, order, seq, cap)).fetchone()
    return 1 + min(int(ahead), cap)
