"""The remote-job journal's SQL: operations the SQLite store runs on its threads.

Writers run on the store's writer thread inside its transactions; readers on a
reader thread. A final state is never overwritten: every update is fenced on the
row still being live.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.remote_jobs import (
    NewRemoteJob,
    RemoteJob,
    RemoteJobState,
    check_remote_finish,
)
from comfyfleet.store.base import StoreError

_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: Version 3 adds the journal; IF NOT EXISTS because a fresh file already has it.
REMOTE_JOBS_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS remote_jobs (
        id           TEXT PRIMARY KEY,
        request_hash TEXT NOT NULL,
        provider     TEXT NOT NULL,
        kind         TEXT NOT NULL,
        prompt_id    TEXT,
        node_id      TEXT,
        slot         INTEGER,
        state        TEXT NOT NULL,
        remote_id    TEXT,
        resume       TEXT NOT NULL,
        error        TEXT,
        attempts     INTEGER NOT NULL DEFAULT 0,
        result       BLOB,
        result_type  TEXT,
        created_at   REAL NOT NULL,
        updated_at   REAL NOT NULL,
        finished_at  REAL
    )
    """,
    "CREATE INDEX IF NOT EXISTS remote_jobs_request "
    "ON remote_jobs (request_hash, state, created_at)",
    "CREATE INDEX IF NOT EXISTS remote_jobs_live ON remote_jobs (created_at) "
    "WHERE state IN ('submitting', 'running')",
    "CREATE INDEX IF NOT EXISTS remote_jobs_finished ON remote_jobs (finished_at) "
    "WHERE finished_at IS NOT NULL",
)

_LIVE = "('submitting', 'running')"
_FIELDS = (
    "id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, "
    "error, attempts, created_at, updated_at, finished_at"
)
INSERT = f"""
INSERT INTO remote_jobs ({_FIELDS})
VALUES (?, ?, ?, ?, ?, ?, NULL, 'submitting', NULL, ?, NULL, 0, ?, ?, NULL)
"""
SUBMITTED = f"""
UPDATE remote_jobs SET state = 'running', remote_id = ?, resume = ?, updated_at = ?
WHERE id = ? AND state IN {_LIVE}
"""
FINISH = f"""
UPDATE remote_jobs
SET state = ?, result = ?, result_type = ?, error = ?, attempts = coalesce(?, attempts),
    updated_at = ?, finished_at = ?
WHERE id = ? AND state IN {_LIVE}
"""
ASSIGN_SLOT = "UPDATE remote_jobs SET slot = ? WHERE id = ?"
SELECT_ONE = f"SELECT {_FIELDS}, result, result_type FROM remote_jobs WHERE id = ?"
SELECT_SUCCEEDED = f"""
SELECT {_FIELDS}, result, result_type FROM remote_jobs
WHERE request_hash = ? AND state = 'succeeded' ORDER BY created_at DESC, rowid DESC LIMIT 1
"""
SELECT_NEWEST = f"""
SELECT {_FIELDS}, NULL, NULL FROM remote_jobs
WHERE request_hash = ? ORDER BY created_at DESC, rowid DESC LIMIT 1
"""
SELECT_LIVE = f"""
SELECT {_FIELDS}, NULL, NULL FROM remote_jobs INDEXED BY remote_jobs_live
WHERE state IN {_LIVE} ORDER BY created_at, rowid
"""
PRUNE = f"DELETE FROM remote_jobs WHERE finished_at < ? AND state NOT IN {_LIVE}"


def migrate(conn: sqlite3.Connection) -> None:
    for statement in REMOTE_JOBS_SCHEMA:
        conn.execute(statement)


def _row(row: Sequence[Any]) -> RemoteJob:
    return RemoteJob(
        id=row[0],
        request_hash=row[1],
        provider=row[2],
        kind=row[3],
        prompt_id=row[4],
        node_id=row[5],
        slot=row[6],
        state=RemoteJobState(row[7]),
        remote_id=row[8],
        resume=json.loads(row[9]),
        error=None if row[10] is None else json.loads(row[10]),
        attempts=row[11],
        created_at=row[12],
        updated_at=row[13],
        finished_at=row[14],
        result=None if row[15] is None else bytes(row[15]),
        result_type=row[16],
    )


# -- writer thread ------------------------------------------------------------------


def record(conn: sqlite3.Connection, job: NewRemoteJob, resume: str, now: float) -> RemoteJob:
    params = (job.id, job.request_hash, job.provider, job.kind, job.prompt_id, job.node_id)
    try:
        conn.execute(INSERT, (*params, resume, now, now))
    except sqlite3.IntegrityError as exc:
        raise StoreError(f"remote job {job.id!r} already exists") from exc
    found = conn.execute(SELECT_ONE, (job.id,)).fetchone()
    return _row(found)


def submitted(
    conn: sqlite3.Connection, job_id: str, remote_id: str, resume: str, now: float
) -> bool:
    return conn.execute(SUBMITTED, (remote_id, resume, now, job_id)).rowcount == 1


def finish(
    conn: sqlite3.Connection,
    job_id: str,
    state: RemoteJobState,
    result: bytes | None,
    result_type: str | None,
    error: str | None,
    attempts: int | None,
    now: float,
) -> bool:
    params = (state.value, result, result_type, error, attempts, now, now, job_id)
    return conn.execute(FINISH, params).rowcount == 1


def assign_slots(conn: sqlite3.Connection, slots: Sequence[tuple[str, int]]) -> None:
    conn.executemany(ASSIGN_SLOT, [(slot, job_id) for job_id, slot in slots])


def prune(conn: sqlite3.Connection, before: float) -> int:
    return conn.execute(PRUNE, (before,)).rowcount


# -- reader threads ------------------------------------------------------------------


def one(conn: sqlite3.Connection, job_id: str) -> RemoteJob | None:
    found = conn.execute(SELECT_ONE, (job_id,)).fetchone()
    return None if found is None else _row(found)


def reusable(conn: sqlite3.Connection, request_hash: str) -> RemoteJob | None:
    found = conn.execute(SELECT_SUCCEEDED, (request_hash,)).fetchone()
    if found is None:
        found = conn.execute(SELECT_NEWEST, (request_hash,)).fetchone()
    return None if found is None else _row(found)


def live(conn: sqlite3.Connection) -> list[RemoteJob]:
    return [_row(found) for found in conn.execute(SELECT_LIVE)]


def encode_finish(
    state: RemoteJobState, result: bytes | None, error: dict[str, Any] | None
) -> str | None:
    """Check a finish on the caller's thread; returns the error as JSON."""
    check_remote_finish(state, result)
    return None if error is None else _dumps(error)


def encode(value: dict[str, Any]) -> str:
    return _dumps(value)
