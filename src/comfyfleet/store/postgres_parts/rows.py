"""Rows of the PostgreSQL store decoded into records, on a worker thread when large."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from comfyfleet.domain.jobs import Job, JobStatus
from comfyfleet.store.postgres_parts.access import loads
from comfyfleet.store.postgres_text import from_db, from_db_or_none

T = TypeVar("T")

#: Characters of JSON decoded on the event loop (a millisecond or two); a result with
#: more is decoded on a worker thread.
DECODE_INLINE = 256 * 1024

#: The JSON columns of a job row (prompt, extra_data), which make most of its size.
JOB_JSON = (4, 5)


def job_from_row(row: Sequence[Any]) -> Job:
    return Job(
        prompt_id=from_db(row[0]),
        number=loads(row[1]),
        front=row[2],
        seq=row[3],
        prompt=loads(row[4]),
        extra_data=loads(row[5]),
        outputs=loads(row[6]),
        client_id=from_db_or_none(row[7]),
        status=JobStatus(row[8]),
        attempt=row[9],
        lane=from_db_or_none(row[10]),
        created_at=row[11],
        started_at=row[12],
        finished_at=row[13],
        error=None if row[14] is None else loads(row[14]),
        tenant=from_db(row[15]),
        owner=from_db_or_none(row[16]),
    )


def text_size(rows: Sequence[Any], columns: Sequence[int]) -> int:
    """Characters of text in these columns of `rows`."""
    return sum(len(row[column] or "") for row in rows for column in columns)


async def decoded(decode: Callable[[], T], size: int) -> T:
    """`decode()`, on a worker thread when it has `size` characters of JSON to decode."""
    if size <= DECODE_INLINE:
        return decode()
    return await asyncio.to_thread(decode)
