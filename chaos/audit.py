"""What the store did to each job, and when: a trigger of the harness's own on the jobs
table records every insert and update (status, attempt, lane, owner), and PostgreSQL's
commit timestamps (`track_commit_timestamp`) say when each took effect. That is how the
checker knows when an attempt was fenced out: no API shows it. The trigger is the
harness's, on its own throwaway database; the server never reads the table."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

INSTALL = """
CREATE TABLE IF NOT EXISTS chaos_audit (
    id          BIGSERIAL PRIMARY KEY,
    prompt_id   TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    lane        TEXT,
    owner       TEXT
);
CREATE OR REPLACE FUNCTION chaos_audit_job() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_audit (prompt_id, status, attempt, lane, owner)
    VALUES (NEW.prompt_id, NEW.status, NEW.attempt, NEW.lane, NEW.owner);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS chaos_audit_job ON jobs;
CREATE TRIGGER chaos_audit_job AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_job();
"""

#: Each change with the time its transaction committed (a row's xmin is the transaction
#: that wrote it: the one that changed the job).
READ = """
SELECT prompt_id, status, attempt, lane, owner,
       extract(epoch FROM pg_xact_commit_timestamp(xmin))::double precision AS committed, id
FROM chaos_audit ORDER BY committed, id
"""

TERMINAL = frozenset({"success", "error", "interrupted", "cancelled"})


@dataclass(frozen=True)
class Change:
    """A job's state from `at` (its commit) on."""

    prompt_id: str
    status: str
    attempt: int
    lane: str | None
    owner: str | None
    at: float


async def install(url: str) -> None:
    """Start recording (the jobs table must exist: after the first gateway started)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(INSTALL)
    finally:
        await conn.close()


async def read(url: str) -> dict[str, list[Change]]:
    """Every job's changes, in commit order."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(READ)
    finally:
        await conn.close()
    changes: dict[str, list[Change]] = {}
    for row in rows:
        change = Change(
            row["prompt_id"], row["status"], row["attempt"], row["lane"], row["owner"],
            row["committed"],
        )  # fmt: skip
        changes.setdefault(change.prompt_id, []).append(change)
    return changes


def state_at(changes: list[Change], when: float) -> Change | None:
    """The job's state at `when`: its last change committed by then."""
    found = None
    for change in changes:
        if change.at > when:
            break
        found = change
    return found
