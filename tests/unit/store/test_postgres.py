"""What the PostgreSQL store promises beyond the JobStore contract."""

from __future__ import annotations

import asyncio
import math
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import asyncpg
import pytest

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.idempotency import IDEMPOTENCY_WINDOW, IdempotentRequest
from comfyfleet.domain.jobs import DispatchKey, Job, JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.domain.prompt_events import EventsAppended, NewPromptEvent
from comfyfleet.domain.remote_jobs import NewRemoteJob
from comfyfleet.store import postgres as postgres_module
from comfyfleet.store.base import QueuedLimitReached, StoreError
from comfyfleet.store.event_wakeups import client_digest
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.store.postgres_parts import wakeups as wakeups_module
from comfyfleet.store.postgres_parts.access import Q as QUERIES
from tests.postgres import RoundTrips, killed_sessions_settled, schema_for
from tests.unit.store.job_helpers import result
from tests.unit.store.stores import Clock, claim_next, kill_while_submitting


def new_job(prompt_id: str, number: float | None = 1) -> NewJob:
    return NewJob(prompt_id, number, False, {"1": {"class_type": "Noop", "inputs": {}}}, {}, ["1"])


@pytest.fixture
def schema(tmp_path: Path) -> str:
    return schema_for(tmp_path)


@pytest.fixture
async def store(postgres_url: str, schema: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(postgres_url, schema=schema)
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def other(postgres_url: str, schema: str) -> AsyncIterator[PostgresStore]:
    """Another gateway's store on the same schema (owner "other")."""
    opened = PostgresStore(postgres_url, schema=schema, owner="other")
    await opened.open()
    yield opened
    await opened.close()


#: Undoes migration 6 (remote-job owners), for tests that start from an older version.
UNDO_REMOTE_JOB_OWNERS = (
    "DROP INDEX remote_jobs_one_live",
    "DROP TABLE remote_job_waiters",
    "ALTER TABLE remote_jobs DROP COLUMN owner",
)


async def sql(url: str, schema: str, statement: str) -> object:
    """One statement on its own connection, in `schema`."""
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


async def test_a_fresh_schema_is_at_the_newest_version(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    version = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert version == postgres_module.SCHEMA_VERSION


async def test_candidates_lock_nothing_and_a_lost_one_is_refused(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    """While this process chooses among candidates, another claims the first one: it is
    not kept waiting, this claim of it is refused, and the next candidate is taken."""
    for i in range(3):
        await store.submit(new_job(f"p{i}", i))
    candidates = await store.candidates(3)
    other = PostgresStore(postgres_url, schema=schema)
    await other.open()
    try:
        elsewhere = await asyncio.wait_for(claim_next(other, "elsewhere"), 10)
    finally:
        await other.close()
    assert elsewhere is not None and elsewhere.prompt_id == "p0"
    assert await store.claim_job(candidates[0], "here") is None
    here = await store.claim_job(candidates[1], "here")
    assert here is not None and (here.prompt_id, here.lane, here.attempt) == ("p1", "here", 1)
    running, pending = await store.queue()
    assert {(job.prompt_id, job.lane) for job in running} == {("p0", "elsewhere"), ("p1", "here")}
    assert [job.prompt_id for job in pending] == ["p2"]


async def test_two_stores_on_one_database_claim_each_job_once(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    ids = [f"p{i}" for i in range(100)]
    for i, prompt_id in enumerate(ids):
        await store.submit(new_job(prompt_id, i))
    other = PostgresStore(postgres_url, schema=schema)
    await other.open()
    claimed: list[Job] = []

    async def claimer(each: PostgresStore, lane: str) -> None:
        while (job := await claim_next(each, lane)) is not None:
            claimed.append(job)

    try:
        await asyncio.gather(*(claimer(s, f"{n}") for n, s in enumerate([store, other] * 4)))
    finally:
        await other.close()
    assert sorted(job.prompt_id for job in claimed) == sorted(ids)
    assert {job.attempt for job in claimed} == {1}


async def test_driver_errors_become_store_errors_without_the_password() -> None:
    store = PostgresStore("postgresql://someone:s3cret-pw@127.0.0.1:1/nothing", connect_timeout=5)
    assert "s3cret-pw" not in repr(store)
    with pytest.raises(StoreError) as caught:
        await store.open()
    assert isinstance(caught.value.__cause__, OSError)
    assert "s3cret-pw" not in str(caught.value)


async def test_an_unparsable_url_is_a_store_error_without_the_password() -> None:
    store = PostgresStore("postgresql://someone:s3cret-pw@[::1/db")
    with pytest.raises(StoreError, match="not a usable PostgreSQL URL") as caught:
        await store.open()
    assert "s3cret-pw" not in str(caught.value)


async def test_closed_store_refuses_work(postgres_url: str, schema: str) -> None:
    store = PostgresStore(postgres_url, schema=schema)
    with pytest.raises(StoreError):
        await store.submit(new_job("p1"))
    await store.open()
    with pytest.raises(StoreError, match="already open"):
        await store.open()
    await store.close()
    with pytest.raises(StoreError):
        await store.get("p1")
    await store.close()  # closing twice is harmless


async def test_newer_schema_is_refused(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.close()
    newer = postgres_module.SCHEMA_VERSION + 1
    await sql(
        postgres_url,
        schema,
        f"INSERT INTO comfyfleet_migrations (version, applied_at) VALUES ({newer}, 0)",
    )
    with pytest.raises(StoreError, match="newer"):
        await PostgresStore(postgres_url, schema=schema).open()


async def test_migrations_run_on_open(
    store: PostgresStore, postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.submit(new_job("p1"))
    await store.close()
    target = postgres_module.SCHEMA_VERSION + 1
    monkeypatch.setattr(postgres_module, "SCHEMA_VERSION", target)
    monkeypatch.setitem(
        postgres_module.MIGRATIONS,
        target,
        "ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
    )
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        assert await again.get("p1") is not None
    finally:
        await again.close()
    assert await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations") == (
        target
    )
    assert await sql(postgres_url, schema, "SELECT priority FROM jobs") == 0


async def test_a_version_2_database_gains_idempotency_keys(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.submit(new_job("old"))
    await store.close()
    # The tables of migrations 3 and on.
    tables = "idempotency_keys, webhook_deliveries, webhook_targets, event_log, backend_owners"
    tables += ", fleet_keys, file_counters, assets"
    await sql(postgres_url, schema, f"DROP TABLE {tables}")
    for statement in UNDO_REMOTE_JOB_OWNERS:
        await sql(postgres_url, schema, statement)
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 2")
    clock = Clock()
    again = PostgresStore(postgres_url, schema=schema, clock=clock)
    await again.open()
    answer = {"prompt_id": "x", "number": 1, "node_errors": {}}
    try:
        assert await again.get("old") is not None
        for i in range(20):
            request = IdempotentRequest(f"k{i}", "h", answer)
            await again.submit(replace(new_job(f"p{i}"), idempotency=request))
        clock.advance(IDEMPOTENCY_WINDOW)
        for i in range(2):  # each keyed submit forgets up to 16 expired keys
            request = IdempotentRequest(f"new{i}", "h", answer)
            await again.submit(replace(new_job(f"new{i}"), idempotency=request))
    finally:
        await again.close()
    assert await sql(postgres_url, schema, "SELECT count(*) FROM idempotency_keys") == 2


async def test_a_version_4_database_gains_the_event_log(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.submit(new_job("old"))
    await store.close()
    await sql(
        postgres_url,
        schema,
        "DROP TABLE event_log, backend_owners, fleet_keys, file_counters, assets",
    )
    for statement in UNDO_REMOTE_JOB_OWNERS:
        await sql(postgres_url, schema, statement)
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 4")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        assert await again.get("old") is not None
        appended = await again.append_prompt_events([NewPromptEvent("old", "progress", {})])
        assert await again.prompt_events("old") == appended
    finally:
        await again.close()
    latest = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert latest == postgres_module.SCHEMA_VERSION


async def test_a_version_5_database_gains_backend_owners(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.submit(new_job("old"))
    await store.close()
    await sql(postgres_url, schema, "DROP TABLE backend_owners, fleet_keys, file_counters, assets")
    for statement in UNDO_REMOTE_JOB_OWNERS:
        await sql(postgres_url, schema, statement)
    await sql(postgres_url, schema, "ALTER TABLE event_log DROP COLUMN frame")
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 5")
    again = PostgresStore(postgres_url, schema=schema, owner="a")
    await again.open()
    try:
        assert await again.get("old") is not None
        await again.join(GatewayRecord("a", "i", "host", 1, "http://x", 1.0), 10.0)
        held = await again.claim_backends({"gpu-1": "client-1"})
        assert [(o.backend, o.client_id, o.owner) for o in held] == [("gpu-1", "client-1", "a")]
    finally:
        await again.close()
    latest = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert latest == postgres_module.SCHEMA_VERSION


async def test_a_version_6_database_gains_owners_and_keeps_one_live_job_per_request(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.close()
    for statement in [
        *UNDO_REMOTE_JOB_OWNERS,
        "DROP TABLE fleet_keys, file_counters, assets",
        "ALTER TABLE event_log DROP COLUMN frame",
        "DELETE FROM comfyfleet_migrations WHERE version > 6",
        # What an older program could leave: two live jobs for one request.
        "INSERT INTO remote_jobs (id, request_hash, provider, kind, state, remote_id, resume, "
        "created_at, updated_at) VALUES ('sent', 'h1', 'bfl', 'image', 'running', 't1', '{}', "
        "1, 1), ('lost', 'h1', 'bfl', 'image', 'submitting', NULL, '{}', 2, 2), "
        "('alone', 'h2', 'bfl', 'image', 'submitting', NULL, '{}', 3, 3)",
    ]:
        await sql(postgres_url, schema, statement)
    again = PostgresStore(postgres_url, schema=schema, owner="g1")
    await again.open()
    try:
        live = await again.live_remote_jobs()  # no owner: orphans, this gateway's to take
        assert [(job.id, job.owner) for job in live] == [("sent", None), ("alone", None)]
        ended = await again.remote_job("lost")
        assert ended is not None and ended.state == "failed"
        assert ended.error is not None and ended.error["class"] == "Superseded"
        taken = await again.adopt_remote_job("sent")
        assert taken is not None and taken.owner == "g1"
        new = NewRemoteJob("new", "h1", "bfl", "image", "p1", "3")
        assert (await again.record_remote_job(new)).id == "sent"
    finally:
        await again.close()
    latest = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert latest == postgres_module.SCHEMA_VERSION


async def test_a_version_7_database_gains_fleet_keys(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.submit(new_job("old"))
    await store.close()
    await sql(postgres_url, schema, "DROP TABLE fleet_keys, file_counters, assets")
    await sql(postgres_url, schema, "ALTER TABLE event_log DROP COLUMN frame")
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 7")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        assert await again.get("old") is not None
        assert await again.fleet_key("peer", b"k" * 32) == b"k" * 32
    finally:
        await again.close()
    applied = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION


async def test_a_version_8_database_keeps_its_events_and_gains_binary_frames(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    (old,) = await store.append_prompt_events([NewPromptEvent("old", "progress", {"v": 1})])
    await store.close()
    await sql(postgres_url, schema, "ALTER TABLE event_log DROP COLUMN frame")
    await sql(postgres_url, schema, "DROP TABLE file_counters, assets")
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 8")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        (frame,) = await again.append_prompt_events(
            [NewPromptEvent("old", "progress_text", {"node_id": "1"}, b"hi")]
        )
        assert await again.prompt_events("old") == [old, frame]
        assert frame.frame == b"hi" and old.frame is None
    finally:
        await again.close()
    applied = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION


async def test_a_version_14_database_keeps_its_jobs_and_gains_the_tenant_cap(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    await store.submit(new_job("old"))
    await store.close()
    await sql(postgres_url, schema, "DROP INDEX jobs_tenant_dispatch")
    await sql(postgres_url, schema, "DROP FUNCTION comfyfleet_admit_tenant(text, bigint)")
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 14")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        with pytest.raises(QueuedLimitReached):  # "old" is default's: its cap is reached
            await again.submit(new_job("new"), max_queued=1)
        await again.submit(new_job("new"), max_queued=2)
    finally:
        await again.close()
    applied = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION == 18


async def test_a_version_15_database_gains_the_journals_budget_columns(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    """Migration 16: the journal's jobs get tenant, model and cost; older jobs count for no
    tenant."""
    from comfyfleet.domain.remote_jobs import NewRemoteJob

    await store.record_remote_job(NewRemoteJob("old", "h0", "bfl", "image", "p0", "3"))
    await store.close()
    await sql(postgres_url, schema, "DROP FUNCTION comfyfleet_paid_lock(text)")
    await sql(
        postgres_url,
        schema,
        "ALTER TABLE remote_jobs DROP COLUMN tenant, DROP COLUMN model, DROP COLUMN cost",
    )
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 15")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        job = NewRemoteJob("new", "h1", "bfl", "image", "p1", "3", {}, "alice", "flux-2-pro", 0.03)
        await again.record_remote_job(job)
        used = await again.paid_usage("alice", 0.0)
        assert (used.paid_jobs, used.spend) == (1, 0.03)
        assert await again.remote_job("old") is not None
    finally:
        await again.close()
    applied = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION


async def test_a_version_16_database_gains_budget_holds(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    """Migration 17: holds of prompts run on backends count for their tenants."""
    from comfyfleet.domain.budgets import Budget, HoldRequest

    await store.submit(new_job("old"))
    await store.close()
    await sql(postgres_url, schema, "DROP TABLE paid_job_holds")
    await sql(postgres_url, schema, "DELETE FROM comfyfleet_migrations WHERE version > 16")
    again = PostgresStore(postgres_url, schema=schema)
    await again.open()
    try:
        request = HoldRequest("p1", "gpu", "alice", Budget(paid_jobs=5), Budget(), 0.0, None)
        assert (await again.hold_paid_jobs(request)).paid_jobs == 5
        assert (await again.paid_usage("alice", 0.0)).paid_jobs == 5
        assert await again.get("old") is not None
    finally:
        await again.close()
    applied = await sql(postgres_url, schema, "SELECT max(version) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION


async def test_stores_opening_at_once_create_the_schema_once(
    postgres_url: str, schema: str
) -> None:
    stores = [PostgresStore(postgres_url, schema=schema) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        await stores[0].submit(new_job("p1"))
        assert all([(await s.get("p1")) is not None for s in stores])
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    applied = await sql(postgres_url, schema, "SELECT count(*) FROM comfyfleet_migrations")
    assert applied == postgres_module.SCHEMA_VERSION


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from comfyfleet.domain.jobs import NewJob
    from comfyfleet.store.postgres import PostgresStore

    async def submitter(store, worker):
        for i in range(1_000_000):
            pid = f"w{worker}-{i}"
            job = NewJob(pid, i, False, {"1": {"class_type": "Noop", "inputs": {}}}, {}, ["1"])
            await store.submit(job)
            print(pid, flush=True)

    async def main():
        store = PostgresStore(sys.argv[1], schema=sys.argv[2])
        await store.open()
        print("open", flush=True)
        await asyncio.gather(*(submitter(store, w) for w in range(16)))

    asyncio.run(main())
    """
)


async def test_committed_submits_survive_sigkill(postgres_url: str, schema: str) -> None:
    committed = await asyncio.to_thread(kill_while_submitting, CHILD, [postgres_url, schema], 1000)
    assert len(committed) >= 1000
    # The server finishes what the killed child had sent (a commit may land a moment after
    # the kill) before it notices the connections are gone: read once they are.
    await killed_sessions_settled(postgres_url)
    store = PostgresStore(postgres_url, schema=schema)
    await store.open()
    try:
        jobs, total = await store.jobs()
        stored = {job.prompt_id for job in jobs}
        assert set(committed) <= stored
        assert total == len(stored) >= len(committed)
        assert (await store.counts())[JobStatus.PENDING] == total
    finally:
        await store.close()


async def test_every_named_query_prepares(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        for name, statement in QUERIES.items():
            try:
                await conn.prepare(statement)
            except asyncpg.PostgresError as exc:
                raise AssertionError(f"query {name} does not prepare: {exc}") from exc
    finally:
        await conn.close()


async def test_claims_read_the_claimable_index_in_order(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    """Before the table has statistics too: no sort of the whole queue per claim."""
    await asyncio.gather(*(store.submit(new_job(f"p{i}", i)) for i in range(300)))
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            await conn.execute(f"PREPARE claimable_{mode} (bigint) AS {QUERIES['claimable']}")
            plan = "\n".join(
                row[0] for row in await conn.fetch(f"EXPLAIN EXECUTE claimable_{mode} (64)")
            )
            assert "Index Scan using jobs_claimable" in plan, plan
            assert "Sort" not in plan, plan
    finally:
        await conn.close()


async def test_a_store_call_is_one_round_trip(postgres_url: str, schema: str) -> None:
    """A connection goes back to the pool as it is: no reset query after each call (the
    store leaves no session state to reset)."""
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        store = PostgresStore(url, schema=schema, pool_size=1)
        await store.open()
        try:
            await store.submit(new_job("p0"))
            await store.get("p0")  # its statement prepared: the next call only runs it
            before = proxy.count
            assert (await store.get("p0")) is not None
            await store.claim_job((await store.candidates(1))[0], "local")
            assert proxy.count - before == 3  # get, candidates, claim_job
        finally:
            await store.close()


async def test_a_counted_submit_is_one_round_trip(postgres_url: str, schema: str) -> None:
    """The queue number comes from the insert's own statement, not a call before it."""
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        store = PostgresStore(url, schema=schema, pool_size=1)
        await store.open()
        try:
            await store.submit(new_job("p0", None))  # prepares the statement
            before = proxy.count
            assert (await store.submit(new_job("p1", None))).number == 1
            assert proxy.count - before == 1
        finally:
            await store.close()


async def test_ends_recorded_together_are_each_their_own(postgres_url: str, schema: str) -> None:
    """Forty attempts end at once: a few statements record them all (group commit), each
    with its own messages and files in order; a stale attempt among them changes nothing."""
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        store = PostgresStore(url, schema=schema)
        await store.open()
        try:
            jobs = []
            for n in range(40):
                await store.submit(new_job(f"p{n}"))
                claimed = await claim_next(store, "lane", only=f"p{n}")
                assert claimed is not None
                jobs.append(claimed)
            stale = jobs[7].attempt + 1

            def ending(n: int) -> JobResult:
                messages = [["execution_start", {"n": n}], ["execution_success", {"n": n}]]
                files = [OutputFile(f"{n}_{k}.png", "", "output") for k in range(n % 3)]
                return replace(result(messages=messages, files=files), outputs={"9": {"n": n}})

            await store.finish("p0", jobs[0].attempt, ending(0))  # prepares the statement
            before = proxy.count
            ended = await asyncio.gather(
                *(
                    store.finish(j.prompt_id, stale if n == 7 else j.attempt, ending(n))
                    for n, j in enumerate(jobs)
                    if n > 0
                )
            )
            assert proxy.count - before <= 10
            assert ended == [n != 7 for n in range(1, 40)]
            for n in range(40):
                entry = await store.history_entry(f"p{n}")
                if n == 7:
                    assert entry is None and (await store.get("p7")).status is JobStatus.RUNNING  # type: ignore[union-attr]
                    continue
                assert entry is not None
                assert entry.result.outputs == {"9": {"n": n}}
                assert entry.result.messages == ending(n).messages
                assert [f.filename for f in entry.result.files] == [
                    f"{n}_{k}.png" for k in range(n % 3)
                ]
        finally:
            await store.close()


async def test_an_end_the_statement_refuses_fails_alone(
    postgres_url: str, schema: str, store: PostgresStore
) -> None:
    """A batch the database refuses is recorded again one end at a time: only the end
    that cannot be recorded fails."""
    for n in range(6):
        await store.submit(new_job(f"p{n}"))
    jobs = [await claim_next(store, "lane", only=f"p{n}") for n in range(6)]
    # p3 has a history entry already: its end's insert breaks the batch's statement.
    await sql(
        postgres_url,
        schema,
        "INSERT INTO history (prompt_id, status, outputs, meta, completed_at)"
        " VALUES ('p3', 'success', '{}', '{}', 0)",
    )
    ends = [store.finish(j.prompt_id, j.attempt, result()) for j in jobs if j is not None]
    ended = await asyncio.gather(*ends, return_exceptions=True)
    assert isinstance(ended[3], StoreError)
    assert [e for n, e in enumerate(ended) if n != 3] == [True] * 5
    assert (await store.get("p3")).status is JobStatus.RUNNING  # type: ignore[union-attr]


async def test_looking_up_and_recording_a_new_remote_job_are_one_round_trip_each(
    postgres_url: str, schema: str
) -> None:
    """The look-up is one query; the id's own check is made only when the request
    already has a live job."""
    proxy = RoundTrips(postgres_url)
    async with proxy as url:
        store = PostgresStore(url, schema=schema, pool_size=1)
        await store.open()
        try:
            for n in range(2):  # the first prepares the statements
                job = NewRemoteJob(
                    id=f"r{n}",
                    request_hash=f"h{n}",
                    provider="bfl",
                    kind="image",
                    prompt_id="p",
                    node_id="1",
                    resume={},
                )
                before = proxy.count
                assert (await store.record_remote_job(job)).id == f"r{n}"
            assert proxy.count - before == 1
            before = proxy.count
            assert await store.reusable_remote_jobs(["h-new"]) == {}  # a new request's look-up
            assert proxy.count - before == 1
            with pytest.raises(StoreError):  # the same id again is still refused
                await store.record_remote_job(replace(job, request_hash="h9"))
            with pytest.raises(StoreError):  # also while its request has a live job
                await store.record_remote_job(job)
        finally:
            await store.close()


async def test_work_queued_by_one_gateway_wakes_another(
    postgres_url: str, schema: str, store: PostgresStore
) -> None:
    """The wake-up names the gateway and the job's place in the queue."""
    other = PostgresStore(postgres_url, schema=schema, owner="other")
    await other.open()
    try:
        woken: asyncio.Queue[tuple[str, DispatchKey | None]] = asyncio.Queue()
        await store.watch_work(lambda owner, key: woken.put_nowait((owner, key)))
        theirs = await other.submit(new_job("theirs", 2.5))
        assert await asyncio.wait_for(woken.get(), 5) == ("other", theirs.dispatch_key())
        await other.submit(new_job("claimed at once"), claim_for="local")  # nothing claimable
        front = await other.submit(NewJob("front", 7, True, {}, {}, []))
        assert await asyncio.wait_for(woken.get(), 5) == ("other", front.dispatch_key())
        assert woken.empty()
        job = await claim_next(other, "local", only="theirs")
        assert job is not None and await other.requeue(job.prompt_id, job.attempt)
        assert await asyncio.wait_for(woken.get(), 5) == ("other", theirs.dispatch_key())
    finally:
        await other.close()


def test_a_work_payload_without_a_place_is_still_a_wake_up() -> None:
    assert wakeups_module.parse_work("gw-1") == ("gw-1", None)  # as gateways sent before
    assert wakeups_module.parse_work("gw-1 1 Infinity 3") == ("gw-1", (1, math.inf, 3))
    assert wakeups_module.parse_work("gw-1 1 x 3") == ("gw-1", None)
    assert wakeups_module.parse_work("") == ("", None)


async def test_a_work_payload_keeps_the_exact_key_whatever_the_server_prints(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    # A server set to print floats rounded (extra_float_digits 0: 15 digits) would
    # make two near keys one; the payload keeps every bit of the place.
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        await conn.execute("SET extra_float_digits = 0")
        near = "0.1::double precision + 0.2::double precision"
        assert await conn.fetchval(f"SELECT ({near})::text") == "0.3"
        payload = await conn.fetchval(f"SELECT comfyfleet_work_payload('gw', false, {near}, 42)")
    finally:
        await conn.close()
    assert wakeups_module.parse_work(payload) == ("gw", (1, 0.1 + 0.2, 42))


async def test_a_number_stored_by_one_gateway_moves_every_gateways_counter(
    store: PostgresStore, other: PostgresStore
) -> None:
    assert await store.next_number() == 0
    await other.submit(new_job("imported", 500))
    assert await store.next_number() == 501
    assert await other.next_number() == 502


async def test_gateways_number_counted_jobs_from_one_counter(
    store: PostgresStore, other: PostgresStore
) -> None:
    numbers = []
    for n in range(6):
        gateway = (store, other)[n % 2]
        numbers.append((await gateway.submit(new_job(f"p{n}", None))).number)
        if n == 2:
            await other.next_number()  # a request refused on the other gateway
    assert numbers == [0, 1, 2, 4, 5, 6]


async def listener_sessions(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE $1",
            postgres_module.LISTENER_NAME + " %",
        )
        return [row[0] for row in rows]
    finally:
        await conn.close()


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_another_processes_appends_wake_this_one(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    other = PostgresStore(postgres_url, schema=schema)
    await other.open()
    try:
        await other.submit(replace(new_job("theirs"), client_id="c"))
        found: list[EventsAppended] = []
        await store.watch_events(found.append)
        await other.append_prompt_events([NewPromptEvent("theirs", "progress", {})])
        await until(lambda: len(found) == 1)
        assert found == [EventsAppended("theirs", client_digest("default", "c"), ours=False)]
    finally:
        await other.close()


async def test_a_listener_that_lost_its_connection_listens_again_and_catches_up(
    store: PostgresStore, postgres_url: str, schema: str
) -> None:
    other = PostgresStore(postgres_url, schema=schema)
    await other.open()
    try:
        found: list[EventsAppended] = []
        work: list[str] = []
        await store.watch_events(found.append)
        await store.watch_work(lambda owner, _key: work.append(owner))
        (pid,) = await listener_sessions(postgres_url)
        assert await sql(postgres_url, schema, f"SELECT pg_terminate_backend({pid})")
        # Appended while nothing listens (most runs), or just after: announced either way.
        await other.append_prompt_events([NewPromptEvent("meanwhile", "progress", {})])
        await until(lambda: any(w.prompt_id == "meanwhile" for w in found))
        await until(lambda: store._listener.reconnects == 1)
        assert "" in work  # slots look at the queue again too
        (again,) = await listener_sessions(postgres_url)
        assert again != pid
        # And it listens: the next append is notified.
        await other.append_prompt_events([NewPromptEvent("after", "progress", {})])
        await until(lambda: any(w.prompt_id == "after" for w in found))
    finally:
        await other.close()
