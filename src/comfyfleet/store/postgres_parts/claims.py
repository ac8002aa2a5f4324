"""Claims of the PostgreSQL store, and the tenants' counts fair share reads: a claim of
a capped tenant's job counts its running jobs, one claim of that tenant at a time
across the gateways (see scheduler/fair_share.py)."""

from __future__ import annotations

import math
from typing import Any

from comfyfleet.domain.jobs import Job
from comfyfleet.domain.shares import TenantCounts
from comfyfleet.store.base import MAX_QUEUE_POSITION
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q
from comfyfleet.store.postgres_text import from_db, to_db


class PostgresClaims(PostgresAccess):
    """Claims, capped per tenant or not, and the tenants' counts."""

    owner: str
    _owner_db: str

    async def claim_job(self, job: Job, lane: str, running_cap: int | None = None) -> Job | None:
        """Start a candidate on `lane`; None when it is no longer claimable so (or its
        tenant runs `running_cap` jobs already, fleet-wide)."""
        now = self._clock()
        params = (to_db(job.prompt_id), to_db(lane), now, self._owner_db, job.attempt)
        if running_cap is None:
            attempt = await self._commit(lambda db: db.fetchval(Q["claim_job"], *params))
        else:
            tenant = to_db(job.tenant)

            async def capped(conn: Any) -> Any:
                await conn.execute(Q["lock_tenant_running"], tenant)
                return await conn.fetchval(Q["claim_job_capped"], *params, tenant, running_cap)

            attempt = await self._write(capped)
        return None if attempt is None else job.started(lane, attempt, now, self.owner)

    async def tenant_counts(self) -> dict[str, TenantCounts]:
        """Each tenant's pending (claimable) and running jobs, and its oldest claimable."""
        rows = await self._run(lambda db: db.fetch(Q["tenant_counts"]))
        return {
            from_db(tenant): TenantCounts(
                int(pending), int(running), math.inf if oldest is None else float(oldest)
            )
            for tenant, pending, running, oldest in rows
        }

    async def queue_position(self, prompt_id: str, *, own_tenant: bool = False) -> int | None:
        """1 + the pending jobs ahead of a pending job (its tenant's only with
        `own_tenant`), at most MAX_QUEUE_POSITION; None when it is not pending."""
        query = Q["queue_position_of"] if own_tenant else Q["queue_position"]
        cap = MAX_QUEUE_POSITION - 1
        ahead = await self._run(lambda db: db.fetchval(query, to_db(prompt_id), cap))
        return None if ahead is None else 1 + min(int(ahead), cap)
