"""Jobs of gateways whose lease lapsed, put back or adopted by a live one."""

from __future__ import annotations

from dataclasses import replace

from comfyfleet.domain.jobs import Job
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q, dumps
from comfyfleet.store.postgres_parts.rows import job_from_row
from comfyfleet.store.postgres_text import to_db


class PostgresTakeover(PostgresAccess):
    """Orphaned running jobs: read, re-queued, or adopted (fenced on their attempt)."""

    async def orphaned(self) -> list[Job]:
        rows = await self._run(lambda db: db.fetch(Q["orphaned"], self._clock()))
        return [job_from_row(row) for row in rows]

    async def requeue_orphaned(self, job: Job) -> bool:
        params = (to_db(job.prompt_id), job.attempt, self._clock(), self._owner_db)
        return bool(await self._commit(lambda db: db.fetchval(Q["requeue_orphaned"], *params)))

    async def adopt(self, job: Job) -> Job | None:
        note = dumps({"kind": "adopted", "from": job.owner})
        params = (to_db(job.prompt_id), job.attempt, self._clock(), self._owner_db, note)
        if not await self._commit(lambda db: db.fetchval(Q["adopt"], *params)):
            return None
        return replace(job, attempt=job.attempt + 1, owner=self.owner)
