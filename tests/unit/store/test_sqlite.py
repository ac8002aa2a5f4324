"""What the SQLite store promises beyond the JobStore contract."""

from __future__ import annotations

import asyncio
import sqlite3
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from comfyfleet.domain.budgets import Budget, HoldRequest
from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.idempotency import IDEMPOTENCY_WINDOW, IdempotentRequest
from comfyfleet.domain.jobs import JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.domain.prompt_events import NewPromptEvent
from comfyfleet.domain.remote_jobs import NewRemoteJob
from comfyfleet.store import sqlite as sqlite_module
from comfyfleet.store.base import StoreError
from comfyfleet.store.sqlite import SELECT_PENDING, SQLiteStore
from tests.helpers import as_older_schema
from tests.unit.store.stores import Clock, claim_next, kill_while_submitting


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "jobs.db")
    await opened.open()
    yield opened
    await opened.close()


#: What takes a current file's journal back to before it was shared (version 9).
UNDO_REMOTE_JOB_OWNERS = (
    "DROP INDEX remote_jobs_one_live",
    "DROP TABLE remote_job_waiters",
    "ALTER TABLE remote_jobs DROP COLUMN owner",
)


def new_job(prompt_id: str, number: float = 1, tenant: str = "default") -> NewJob:
    prompt = {"1": {"class_type": "Noop", "inputs": {}}}
    return NewJob(prompt_id, number, False, prompt, {}, ["1"], tenant=tenant)


async def stall_writer(store: SQLiteStore, seconds: float) -> asyncio.Future[None]:
    """Keep the writer thread busy, so what is submitted meanwhile queues up."""
    stall = asyncio.ensure_future(store._write(lambda conn: time.sleep(seconds)))
    await asyncio.sleep(0.02)  # let the writer pick it up
    return stall


async def test_file_is_in_wal_mode(store: SQLiteStore) -> None:
    with closing(sqlite3.connect(store.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == sqlite_module.SCHEMA_VERSION


async def test_reopen_keeps_everything(tmp_path: Path) -> None:
    first = SQLiteStore(tmp_path / "jobs.db")
    await first.open()
    await first.submit(new_job("done", 1))
    await first.submit(new_job("waiting", 2))
    job = await claim_next(first, "lane")
    assert job is not None
    files = [OutputFile("x.png", "", "output")]
    outcome = JobResult(JobStatus.SUCCESS, {"1": {"a": [1.5]}}, {}, [["m", {"k": 1}]], None, files)
    await first.finish("done", job.attempt, outcome)
    before = (await first.queue(), await first.history(), await first.jobs())
    await first.close()

    second = SQLiteStore(tmp_path / "jobs.db")
    await second.open()
    try:
        after = (await second.queue(), await second.history(), await second.jobs())
        assert after == before
        entry = await second.history_entry("done")
        assert entry is not None and entry.result == outcome
    finally:
        await second.close()


async def test_dispatch_reads_an_index_in_order(store: SQLiteStore) -> None:
    with closing(sqlite3.connect(store.path)) as conn:
        plan = " ".join(
            row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + SELECT_PENDING, (8,))
        )
    assert "jobs_dispatch" in plan
    assert "TEMP B-TREE" not in plan


async def test_group_commit_batches_concurrent_writes(store: SQLiteStore) -> None:
    stall = await stall_writer(store, 0.2)
    before = store.stats.transactions
    await asyncio.gather(*(store.submit(new_job(f"p{i}", i)) for i in range(300)))
    await stall
    used = store.stats.transactions - before
    assert used <= 3  # 300 operations in batches of at most 256
    assert (await store.counts())[JobStatus.PENDING] == 300


async def test_without_grouping_each_write_commits_alone(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", max_batch=1)
    await store.open()
    try:
        before = store.stats.transactions
        await asyncio.gather(*(store.submit(new_job(f"p{i}", i)) for i in range(20)))
        assert store.stats.transactions - before == 20
    finally:
        await store.close()


async def test_a_failing_write_fails_alone_in_its_batch(store: SQLiteStore) -> None:
    await store.submit(new_job("taken"))
    stall = await stall_writer(store, 0.2)
    ids = [f"p{i}" for i in range(10)]
    ids.insert(5, "taken")
    outcomes = await asyncio.gather(
        *(store.submit(new_job(pid)) for pid in ids), return_exceptions=True
    )
    await stall
    failed = [pid for pid, outcome in zip(ids, outcomes) if isinstance(outcome, BaseException)]
    assert failed == ["taken"]
    assert isinstance(outcomes[5], StoreError)
    assert store.stats.retries == 1
    assert (await store.counts())[JobStatus.PENDING] == 11


async def test_candidates_are_read_while_the_writer_is_busy(store: SQLiteStore) -> None:
    """Choosing a job waits on no write: only the fenced claim of the one chosen does."""
    await store.submit(new_job("p1"))
    stall = await stall_writer(store, 1.0)
    candidates = await asyncio.wait_for(store.candidates(4), 0.5)
    assert [job.prompt_id for job in candidates] == ["p1"]
    claim = asyncio.ensure_future(store.claim_job(candidates[0], "lane"))
    await asyncio.sleep(0.05)
    assert not claim.done()  # behind the stalled write
    await stall
    assert (await claim) is not None


async def test_driver_errors_become_store_errors(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    store = SQLiteStore(tmp_path / "dir.db")
    with pytest.raises(StoreError) as caught:
        await store.open()
    assert isinstance(caught.value.__cause__, sqlite3.Error)


async def test_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    with pytest.raises(StoreError):
        await store.submit(new_job("p1"))
    await store.open()
    await store.close()
    with pytest.raises(StoreError):
        await store.get("p1")
    await store.close()  # closing twice is harmless


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {sqlite_module.SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        await SQLiteStore(path).open()


async def test_migrations_run_on_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("p1"))
    await store.close()

    def add_column(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0")

    target = sqlite_module.SCHEMA_VERSION + 1
    monkeypatch.setattr(sqlite_module, "SCHEMA_VERSION", target)
    monkeypatch.setitem(sqlite_module.MIGRATIONS, target, add_column)
    store = SQLiteStore(path)
    await store.open()
    try:
        assert await store.get("p1") is not None
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == target
        columns = [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
    assert "priority" in columns


async def test_version_1_file_gains_the_backends_table(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("p1"))
    await store.close()
    as_older_schema(path, 1, "DROP TABLE backends")
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.save_backend("gpu0", {"url": "http://127.0.0.1:9", "name": "gpu0"})
        assert await store.backends() == [{"url": "http://127.0.0.1:9", "name": "gpu0"}]
        assert await store.get("p1") is not None
    finally:
        await store.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from comfyfleet.domain.jobs import NewJob
    from comfyfleet.store.sqlite import SQLiteStore

    async def submitter(store, worker):
        for i in range(1_000_000):
            pid = f"w{worker}-{i}"
            job = NewJob(pid, i, False, {"1": {"class_type": "Noop", "inputs": {}}}, {}, ["1"])
            await store.submit(job)
            print(pid, flush=True)

    async def main():
        store = SQLiteStore(Path(sys.argv[1]))
        await store.open()
        print("open", flush=True)
        await asyncio.gather(*(submitter(store, w) for w in range(16)))

    asyncio.run(main())
    """
)


async def test_committed_submits_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    committed = await asyncio.to_thread(kill_while_submitting, CHILD, [str(path)], 2000)
    assert len(committed) >= 2000
    store = SQLiteStore(path)
    await store.open()
    try:
        jobs, total = await store.jobs()
        stored = {job.prompt_id for job in jobs}
        assert set(committed) <= stored
        assert total == len(stored) >= len(committed)
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- upgrades of older files -------------------------------------------------------------

REMOTE_JOB = NewRemoteJob("j1", "h1", "bfl", "image", "p1", "3")


async def test_version_2_file_gains_the_journal(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    await store.close()
    with closing(sqlite3.connect(tmp_path / "jobs.db")) as conn:
        conn.execute("DROP TABLE remote_jobs")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    try:
        await store.record_remote_job(REMOTE_JOB)
        assert [job.id for job in await store.live_remote_jobs()] == ["j1"]
    finally:
        await store.close()
    with closing(sqlite3.connect(tmp_path / "jobs.db")) as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == sqlite_module.SCHEMA_VERSION


async def test_version_3_file_gains_the_tenant_column(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await run_to_end(store, "old")
    await store.submit(new_job("waiting", 2))
    await store.close()
    drops = (
        "DROP INDEX jobs_tenant_dispatch",
        "DROP INDEX jobs_tenant_claimable",
        "DROP INDEX jobs_tenant",
    )
    as_older_schema(path, 3, *drops, "ALTER TABLE jobs DROP COLUMN tenant")

    store = SQLiteStore(path)
    await store.open()
    try:
        old = await store.get("old")
        assert old is not None and old.tenant == "default"
        assert [e.job.prompt_id for e in await store.history(tenant="default")] == ["old"]
        assert [j.prompt_id for j in (await store.queue(tenant="default"))[1]] == ["waiting"]
        await store.submit(new_job("new", 3, "alice"))
        assert await store.owned(["old", "new", "waiting"], "alice") == ["new"]
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(jobs)")}
    assert "jobs_tenant" in indexes


async def test_version_4_file_gains_owners_and_its_running_jobs_are_orphans(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("was running"))
    assert await claim_next(store, "local") is not None
    await store.close()
    as_older_schema(path, 4, "DROP TABLE gateways", "ALTER TABLE jobs DROP COLUMN owner")

    store = SQLiteStore(path, owner="g1")
    await store.open()
    try:
        assert [job.prompt_id for job in await store.orphaned()] == ["was running"]
        assert await store.requeue_lane("local") == ["was running"]
        job = await claim_next(store, "local")
        assert job is not None and job.owner == "g1"
        assert (await store.get("was running")).owner == "g1"  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_version_5_file_gains_idempotency_keys(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 5, "DROP TABLE idempotency_keys")


async def test_version_6_file_gains_the_webhook_outbox(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    hooked = replace(new_job("old"), extra_data={"webhook_url": "https://h.example/"})
    await store.submit(hooked)
    await store.close()
    as_older_schema(path, 6, "DROP TABLE webhook_deliveries", "DROP TABLE webhook_targets")

    store = SQLiteStore(path)
    await store.open()
    try:
        assert await store.get("old") is not None
        answer = {"prompt_id": "new", "number": 1, "node_errors": {}}
        keyed = replace(new_job("new"), idempotency=IdempotentRequest("k", "h", answer))
        await store.submit(keyed)
        first = await store.idempotent_request("default", "k")
        assert first is not None and first.answer == answer
        await run_to_end(store, "old")
        [delivery] = (await store.webhook_deliveries())[0]
        assert (delivery.prompt_id, delivery.url) == ("old", "https://h.example/")
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_keyed_submits_forget_expired_keys(tmp_path: Path) -> None:
    clock = Clock()
    store = SQLiteStore(tmp_path / "jobs.db", clock=clock)
    await store.open()
    answer = {"prompt_id": "x", "number": 1, "node_errors": {}}
    try:
        for i in range(20):
            request = IdempotentRequest(f"k{i}", "h", answer)
            await store.submit(replace(new_job(f"p{i}"), idempotency=request))
        clock.advance(IDEMPOTENCY_WINDOW)
        for i in range(2):  # each keyed submit forgets up to 16
            request = IdempotentRequest(f"new{i}", "h", answer)
            await store.submit(replace(new_job(f"new{i}"), idempotency=request))
    finally:
        await store.close()
    with closing(sqlite3.connect(tmp_path / "jobs.db")) as conn:
        keys = {row[0] for row in conn.execute("SELECT key FROM idempotency_keys")}
    assert keys == {"new0", "new1"}


async def run_to_end(store: SQLiteStore, prompt_id: str) -> None:
    """Claim `prompt_id` (it must be next in line) and finish it with one output file."""
    job = await claim_next(store, "lane")
    assert job is not None and job.prompt_id == prompt_id
    files = [OutputFile(f"{prompt_id}.png", "", "output")]
    result = JobResult(JobStatus.SUCCESS, {"1": {}}, {}, [], None, files)
    assert await store.finish(prompt_id, job.attempt, result)


async def test_version_7_file_gains_the_event_log(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 7, "DROP TABLE event_log")

    store = SQLiteStore(path)
    await store.open()
    try:
        assert await store.get("old") is not None
        appended = await store.append_prompt_events([NewPromptEvent("old", "progress", {})])
        assert await store.prompt_events("old") == appended
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_version_8_file_gains_backend_owners(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, owner="a")
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 8, "DROP TABLE backend_owners", *UNDO_REMOTE_JOB_OWNERS)

    store = SQLiteStore(path, owner="a")
    await store.open()
    try:
        assert await store.get("old") is not None
        await store.join(GatewayRecord("a", "i", "host", 1, "http://x", 1.0), 10.0)
        held = await store.claim_backends({"gpu-1": "client-1"})
        assert [(o.backend, o.client_id, o.owner) for o in held] == [("gpu-1", "client-1", "a")]
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_version_9_file_gains_owners_and_keeps_one_live_job_per_request(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, owner="g1")
    await store.open()
    await store.close()
    as_older_schema(path, 9, *UNDO_REMOTE_JOB_OWNERS)
    with closing(sqlite3.connect(path)) as conn:  # what an older program could leave
        for job_id, remote_id, at in [
            ("sent", "t1", 1.0),
            ("lost", None, 2.0),
            ("alone", None, 3.0),
        ]:
            conn.execute(
                "INSERT INTO remote_jobs (id, request_hash, provider, kind, state, remote_id, "
                "resume, created_at, updated_at) VALUES (?, ?, 'bfl', 'image', ?, ?, '{}', ?, ?)",
                (
                    job_id,
                    "h2" if job_id == "alone" else "h1",
                    "running" if remote_id else "submitting",
                    remote_id,
                    at,
                    at,
                ),
            )
        conn.commit()
    store = SQLiteStore(path, owner="g1")
    await store.open()
    try:
        live = await store.live_remote_jobs()  # no owner: orphans, this gateway's to take
        assert [(job.id, job.owner) for job in live] == [("sent", None), ("alone", None)]
        ended = await store.remote_job("lost")
        assert ended is not None and ended.state == "failed"
        assert ended.error is not None and ended.error["class"] == "Superseded"
        taken = await store.adopt_remote_job("sent")
        assert taken is not None and taken.owner == "g1"
        assert (await store.record_remote_job(replace(REMOTE_JOB, id="new"))).id == "sent"
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_version_10_file_gains_fleet_keys(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 10, "DROP TABLE fleet_keys")

    store = SQLiteStore(path)
    await store.open()
    try:
        assert await store.get("old") is not None
        assert await store.fleet_key("peer", b"k" * 32) == b"k" * 32
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_version_16_file_gains_budget_holds(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 16, "DROP TABLE paid_job_holds")

    store = SQLiteStore(path)
    await store.open()
    try:
        request = HoldRequest("p1", "gpu", "alice", Budget(paid_jobs=5), Budget(), 0.0, None)
        assert (await store.hold_paid_jobs(request)).paid_jobs == 5
        assert (await store.paid_usage("alice", 0.0)).paid_jobs == 5
        assert await store.get("old") is not None
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_version_17_file_gains_the_claimable_indexes(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.submit(new_job("old"))
    await store.close()
    as_older_schema(path, 17, "DROP INDEX jobs_claimable", "DROP INDEX jobs_tenant_claimable")

    store = SQLiteStore(path)
    await store.open()
    try:  # the claims' reads name the indexes: they fail without them
        assert [job.prompt_id for job in await store.candidates(16)] == ["old"]
        assert [j.prompt_id for j in await store.candidates(16, tenant="default")] == ["old"]
    finally:
        await store.close()


async def test_version_11_file_keeps_its_events_and_gains_binary_frames(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    (old,) = await store.append_prompt_events([NewPromptEvent("old", "progress", {"v": 1})])
    await store.close()
    as_older_schema(path, 11, "ALTER TABLE event_log DROP COLUMN frame")

    store = SQLiteStore(path)
    await store.open()
    try:
        (frame,) = await store.append_prompt_events(
            [NewPromptEvent("old", "progress_text", {"node_id": "1"}, b"hi")]
        )
        assert await store.prompt_events("old") == [old, frame]
        assert frame.frame == b"hi" and old.frame is None
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_a_journal_from_before_budgets_gets_their_columns(tmp_path: Path) -> None:
    """Version 16: the journal's jobs get tenant, model and cost; older jobs count for
    no tenant, newer ones for theirs."""
    from comfyfleet.domain.remote_jobs import NewRemoteJob

    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.close()
    as_older_schema(
        path,
        15,
        "DROP INDEX remote_jobs_tenant",
        "DROP INDEX remote_jobs_prompt",
        "ALTER TABLE remote_jobs DROP COLUMN tenant",
        "ALTER TABLE remote_jobs DROP COLUMN model",
        "ALTER TABLE remote_jobs DROP COLUMN cost",
        "INSERT INTO remote_jobs (id, request_hash, provider, kind, state, resume, created_at, "
        "updated_at) VALUES ('old', 'h0', 'bfl', 'image', 'running', '{}', 10.0, 10.0)",
    )
    store = SQLiteStore(path)
    await store.open()
    try:
        job = NewRemoteJob("new", "h1", "bfl", "image", "p1", "3", {}, "alice", "flux-2-pro", 0.03)
        await store.record_remote_job(job)
        used = await store.paid_usage("alice", 0.0)
        assert (used.paid_jobs, used.spend) == (1, 0.03)
        assert (await store.remote_job("old")) is not None
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


def _steps(path: Path, query: str, params: tuple[object, ...]) -> int:
    """SQLite VM instructions one run of `query` takes: work done, counted
    deterministically, where a time would swing with the machine's load."""
    counted = [0]

    def tick() -> int:
        counted[0] += 1
        return 0

    with closing(sqlite3.connect(path)) as conn:
        conn.set_progress_handler(tick, 1)
        conn.execute(query, params).fetchall()
    return counted[0]


async def test_a_claims_read_steps_over_no_job_set_aside_for_a_lane(tmp_path: Path) -> None:
    """A thousand busy backends each hold their next job (reserved): a claim's read of
    the queue's front must not walk past them all each time."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    await store.open()
    front = (sqlite_module.SELECT_CLAIMABLE, (16,))
    of_tenant = (sqlite_module.Q["select_claimable_of"], ("default", 16))
    try:
        for n in range(600):
            await store.submit(new_job(f"p{n:04d}", n))
        before = [_steps(path, *front), _steps(path, *of_tenant)]
        for job in await store.candidates(256):  # the queue's front, set aside
            assert await store.reserve_job(job, "backend:gpu")
        after = [_steps(path, *front), _steps(path, *of_tenant)]
    finally:
        await store.close()
    # 16 rows read either way, whether 256 reserved jobs are ahead of them or none.
    assert all(steps < 1.2 * first for steps, first in zip(after, before, strict=True)), (
        before,
        after,
    )
