"""The small pieces under the PostgreSQL store: named SQL blocks, stored text, URLs."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from comfyfleet.store.postgres_parts.url import is_postgres_url, redact_url, redact_urls_in
from comfyfleet.store.postgres_text import from_db, to_db
from comfyfleet.store.sql_blocks import load_blocks, parse_blocks
from comfyfleet.store.sqlite import MIGRATIONS


def test_named_blocks_are_read_without_header_or_description() -> None:
    text = """-- a header
-- name: first
-- what it does
SELECT 1
-- a comment inside stays
FROM t

-- name: second_2
UPDATE t SET a = 1
"""
    assert parse_blocks(text) == {
        "first": "SELECT 1\n-- a comment inside stays\nFROM t",
        "second_2": "UPDATE t SET a = 1",
    }
    with pytest.raises(ValueError, match="twice"):
        parse_blocks("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")
    with pytest.raises(ValueError, match="empty"):
        parse_blocks("-- name: a\n-- only a description\n")


def test_the_shipped_files_have_their_blocks() -> None:
    queries = load_blocks("postgres_queries.sql")
    assert {"insert_job", "claimable", "claim_job", "finish_jobs"} <= set(queries)
    assert "migration_1" in load_blocks("postgres_schema.sql")
    assert {"insert_job", "claim_candidate", "finish_job"} <= set(load_blocks("sqlite_queries.sql"))
    assert "migration_1" in load_blocks("sqlite_schema.sql")


def test_every_sqlite_named_query_prepares(tmp_path: Path) -> None:
    """Each block compiles against the schema a fresh file gets (EXPLAIN runs nothing)."""
    with closing(sqlite3.connect(tmp_path / "store.db", isolation_level=None)) as conn:
        for version in sorted(MIGRATIONS):
            MIGRATIONS[version](conn)
        for name, statement in load_blocks("sqlite_queries.sql").items():
            try:
                # NULL for each parameter: compiled, never run, so no values are needed.
                sql = re.sub(r"\?\d*|:[a-z_]+\b", "NULL", statement.format(marks="?, ?"))
                conn.execute("EXPLAIN " + sql)
            except sqlite3.Error as exc:
                raise AssertionError(f"query {name} does not prepare: {exc}") from exc


@pytest.mark.parametrize(
    "text", ["", "plain", "\x00", "\x01", "\x01\x02", "\x00\x01\x00", "a\x01\x01b", "\\0"]
)
def test_stored_text_round_trips_without_nul(text: str) -> None:
    stored = to_db(text)
    assert "\x00" not in stored
    assert from_db(stored) == text


def test_urls_are_shown_without_their_password() -> None:
    url = "postgresql://fleet:p%40ss@db.example:5432/jobs?sslpassword=k3y&sslmode=require"
    assert redact_url(url) == (
        "postgresql://fleet:***@db.example:5432/jobs?sslpassword=***&sslmode=require"
    )
    assert redact_url(url, "failed for p@ss, p%40ss and k3y") == "failed for ***, *** and ***"
    assert redact_url("postgres://fleet@db/jobs") == "postgres://fleet@db/jobs"
    assert redact_url("postgresql:///jobs?password=x") == "postgresql:///jobs?password=***"
    argv = ["serve", "--store=postgresql://a:b@h/d", "postgres://a:b@h/d", "--port"]
    assert [redact_urls_in(arg) for arg in argv] == [
        "serve",
        "--store=postgresql://a:***@h/d",
        "postgres://a:***@h/d",
        "--port",
    ]


def test_which_strings_are_postgres_urls() -> None:
    assert is_postgres_url("postgresql://h/db") and is_postgres_url("POSTGRES://h/db")
    assert not is_postgres_url("data/comfyfleet.db")
    assert not is_postgres_url("mysql://h/db")
