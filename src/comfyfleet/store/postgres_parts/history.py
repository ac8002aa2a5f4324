"""History of the PostgreSQL store: finished jobs' entries, their files, pruning."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from comfyfleet.domain.jobs import HistoryEntry, JobResult, JobStatus, OutputFile
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q, loads
from comfyfleet.store.postgres_parts.rows import JOB_JSON, decoded, job_from_row, text_size
from comfyfleet.store.postgres_text import from_db, to_db, to_db_all, to_db_or_none


class PostgresHistory(PostgresAccess):
    """Entries in completion order, each with the messages and files of its last attempt."""

    async def history(
        self, max_items: int | None = None, offset: int | None = None, *, tenant: str | None = None
    ) -> list[HistoryEntry]:
        """History entries in completion order, paged as ComfyUI does (see JobStore); only
        `tenant`'s entries when one is named."""
        if max_items is not None and max_items <= 0:
            return []
        scope = to_db_or_none(tenant)
        # ComfyUI: without an offset (or a negative one) the newest max_items, oldest
        # first; with one, skip that many from the oldest.
        newest = (offset is None or offset < 0) and max_items is not None

        async def rows(conn: Any) -> list[Any]:
            if newest:
                found = await conn.fetch(Q["history_newest_first"], max_items, scope)
                return list(reversed(found))
            return list(
                await conn.fetch(Q["history_oldest_first"], max_items, max(0, offset or 0), scope)
            )

        return await self._entries(rows)

    async def history_entry(self, prompt_id: str) -> HistoryEntry | None:
        """One history entry, or None."""
        key = to_db(prompt_id)
        entries = await self._entries(lambda conn: conn.fetch(Q["history_one"], key))
        return entries[0] if entries else None

    async def _entries(self, rows_of: Callable[[Any], Awaitable[list[Any]]]) -> list[HistoryEntry]:
        """The history entries of the rows `rows_of` reads, with their messages and
        files, all from one snapshot."""

        async def op(conn: Any) -> tuple[list[Any], list[Any], list[Any]]:
            rows = await rows_of(conn)
            if not rows:
                return rows, [], []
            ids = [row[0] for row in rows]
            events = await conn.fetch(Q["events_of"], ids)
            return rows, events, await conn.fetch(Q["outputs_of"], ids)

        rows, events, files = await self._snapshot(op)
        size = text_size(rows, (*JOB_JSON, 17, 18)) + text_size(events, (2,))
        return await decoded(lambda: history_entries(rows, events, files), size)

    async def delete_history(self, prompt_ids: Sequence[str]) -> None:
        """Remove these entries from the history; the jobs themselves stay."""
        ids = to_db_all(dict.fromkeys(prompt_ids))
        if ids:
            await self._commit(lambda db: db.execute(Q["delete_history"], ids))

    async def clear_history(self, *, tenant: str | None = None) -> None:
        """Remove every history entry (of `tenant`, when one is named); the jobs stay."""
        scope = to_db_or_none(tenant)
        await self._commit(lambda db: db.execute(Q["clear_history"], scope))

    async def prune_history(
        self, *, max_entries: int | None, max_age_seconds: float | None
    ) -> list[OutputFile]:
        """Delete the oldest finished jobs beyond the limits (see JobStore); returns their files."""
        if max_entries is None and max_age_seconds is None:
            return []
        cutoff = -math.inf if max_age_seconds is None else self._clock() - max_age_seconds
        return await self._write(lambda conn: prune(conn, max_entries, cutoff))

    async def listed_outputs(self, files: Sequence[OutputFile]) -> set[OutputFile]:
        """Those of `files` a job still lists (see JobStore)."""
        if not files:
            return set()
        columns = [
            to_db_all(getattr(f, field) for f in files)
            for field in ("filename", "subfolder", "type", "tenant")
        ]
        rows = await self._run(lambda db: db.fetch(Q["listed_outputs"], *columns))
        return {OutputFile(*(from_db(value) for value in row)) for row in rows}


def history_entries(rows: list[Any], events: list[Any], files: list[Any]) -> list[HistoryEntry]:
    messages: dict[str, list[list[Any]]] = {}
    for key, kind, data in events:
        messages.setdefault(key, []).append([from_db(kind), loads(data)])
    written = files_by_job(files, with_tenant=False)
    width = 17  # the job's columns, then the entry's
    entries = []
    for row in rows:
        job = job_from_row(row)
        status, outputs, meta = row[width : width + 3]
        result = JobResult(
            status=JobStatus(status),
            outputs=loads(outputs),
            meta=loads(meta),
            messages=messages.get(row[0], []),
            error=job.error,
            files=written.get(row[0], []),
        )
        entries.append(HistoryEntry(job, result))
    return entries


def files_by_job(rows: list[Any], *, with_tenant: bool) -> dict[str, list[OutputFile]]:
    """outputs_of rows by stored prompt_id, in the order written; each file names its
    job's tenant when `with_tenant`."""
    found: dict[str, list[OutputFile]] = {}
    for key, filename, subfolder, kind, tenant in rows:
        file = OutputFile(from_db(filename), from_db(subfolder), from_db(kind))
        if with_tenant:
            file = replace(file, tenant=from_db(tenant))
        found.setdefault(key, []).append(file)
    return found


async def prune(conn: Any, max_entries: int | None, cutoff: float) -> list[OutputFile]:
    horizon_pos, horizon_time = 0, cutoff
    if max_entries is not None:
        row = await conn.fetchrow(Q["history_at_rank"], max(0, max_entries))
        if row is not None:
            horizon_pos, horizon_time = row[0], max(cutoff, math.nextafter(row[1], math.inf))
    victims = [r[0] for r in await conn.fetch(Q["history_before"], horizon_pos, cutoff)]
    # Jobs with no entry (cancelled, or entry deleted) go once they are older than
    # the newest entry dropped, so they cannot pile up forever.
    victims += [r[0] for r in await conn.fetch(Q["unlisted_before"], horizon_time)]
    if not victims:
        return []
    files = files_by_job(await conn.fetch(Q["outputs_of"], victims), with_tenant=True)
    await conn.execute(Q["delete_jobs"], victims)
    return [file for key in victims for file in files.get(key, [])]
