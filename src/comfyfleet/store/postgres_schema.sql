-- comfyfleet job store on PostgreSQL: the schema, as migrations.
--
-- Block `migration_N` takes a database at version N-1 to version N; the store runs the
-- ones a database lacks, in order, each recorded in comfyfleet_migrations, all in the
-- opening transaction. A new version is a new block: a block once released never changes.
--
-- The tables mirror the SQLite schema (schema.sql). JSON columns hold compact JSON text
-- (TEXT, not JSONB: key order and number spelling come back exactly as stored); times
-- are Unix seconds. Text that comes from outside keeps every character: the store
-- escapes NUL, which PostgreSQL text cannot hold (see postgres_text.py).

-- name: migrations_table
CREATE TABLE IF NOT EXISTS comfyfleet_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at DOUBLE PRECISION NOT NULL
);

-- name: migration_1
CREATE TABLE jobs (
    prompt_id   TEXT COLLATE "C" PRIMARY KEY,
    -- Submission order, from a sequence: never reused.
    seq         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    -- The number exactly as given (24 stays an int, 100.0 a float) ...
    number_json TEXT NOT NULL,
    -- ... and the key dispatch sorts on: the number, or 0 for front jobs, which run FIFO
    -- among themselves before all others.
    order_key   DOUBLE PRECISION NOT NULL,
    front       BOOLEAN NOT NULL,
    status      TEXT COLLATE "C" NOT NULL,
    client_id   TEXT,
    prompt      TEXT NOT NULL,
    extra_data  TEXT NOT NULL,
    outputs     TEXT NOT NULL,   -- outputs_to_execute
    node_errors TEXT NOT NULL,
    attempt     BIGINT NOT NULL DEFAULT 0,
    lane        TEXT COLLATE "C",
    created_at  DOUBLE PRECISION NOT NULL,
    started_at  DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    error       TEXT,
    tenant      TEXT COLLATE "C" NOT NULL DEFAULT 'default'
);

-- The pending queue, and what claims may take, read in order from these indexes. The
-- second holds exactly the claimable jobs: even before the table has statistics, the
-- planner takes a claim's first rows from it, with no sort of the whole queue.
CREATE INDEX jobs_dispatch ON jobs (front DESC, order_key, seq) WHERE status = 'pending';
CREATE INDEX jobs_claimable ON jobs (front DESC, order_key, seq)
    WHERE status = 'pending' AND lane IS NULL;
CREATE INDEX jobs_running ON jobs (started_at, seq) WHERE status = 'running';
CREATE INDEX jobs_created ON jobs (created_at, seq);
CREATE INDEX jobs_status ON jobs (status, created_at, seq);
CREATE INDEX jobs_tenant ON jobs (tenant, created_at, seq);
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE history (
    -- Completion order; an identity, so a deleted entry's position is never reused.
    pos          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prompt_id    TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    status       TEXT NOT NULL,
    outputs      TEXT NOT NULL,  -- node id -> ui
    meta         TEXT NOT NULL,
    completed_at DOUBLE PRECISION NOT NULL
);

CREATE INDEX history_completed ON history (completed_at);

-- The messages each attempt recorded, in order (a history entry's status.messages).
CREATE TABLE events (
    prompt_id TEXT COLLATE "C" NOT NULL REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    attempt   BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    type      TEXT NOT NULL,
    data      TEXT NOT NULL,
    PRIMARY KEY (prompt_id, attempt, seq)
);

-- Files a job wrote, so retention can delete them with the job (`pos`: the order written).
CREATE TABLE outputs (
    pos       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prompt_id TEXT COLLATE "C" NOT NULL REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    filename  TEXT NOT NULL,
    subfolder TEXT NOT NULL,
    type      TEXT NOT NULL
);

CREATE INDEX outputs_job ON outputs (prompt_id, pos);

-- ComfyUI backends added at run time (the admin API); config-file backends are not stored.
CREATE TABLE backends (
    name       TEXT COLLATE "C" PRIMARY KEY,
    spec       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

-- The journal of paid remote jobs (fan-out and provider nodes): see sqlite_parts/journal_sql.py.
-- Not tied to jobs: a result stays reusable after its prompt is pruned.
CREATE TABLE remote_jobs (
    id           TEXT COLLATE "C" PRIMARY KEY,
    pos          BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,  -- the order recorded
    request_hash TEXT COLLATE "C" NOT NULL,
    provider     TEXT NOT NULL,
    kind         TEXT NOT NULL,
    prompt_id    TEXT,
    node_id      TEXT,
    slot         BIGINT,
    state        TEXT COLLATE "C" NOT NULL,
    remote_id    TEXT,
    resume       TEXT NOT NULL,  -- how to find the job again (never a key)
    error        TEXT,
    attempts     BIGINT NOT NULL DEFAULT 0,
    result       BYTEA,
    result_type  TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    finished_at  DOUBLE PRECISION
);

CREATE INDEX remote_jobs_request ON remote_jobs (request_hash, state, created_at, pos);
CREATE INDEX remote_jobs_live ON remote_jobs (created_at, pos)
    WHERE state IN ('submitting', 'running');
CREATE INDEX remote_jobs_finished ON remote_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- ComfyUI's submission counter: a fresh store starts at 0, and a sequence never goes back.
CREATE SEQUENCE job_number MINVALUE 0 START WITH 0;

-- name: migration_2
-- Job owners and gateway leases (see base.GatewayLeases).
ALTER TABLE jobs ADD COLUMN owner TEXT;

CREATE TABLE gateways (
    id          TEXT PRIMARY KEY,
    instance    TEXT NOT NULL,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    url         TEXT NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    seen_at     DOUBLE PRECISION NOT NULL,
    lease_until DOUBLE PRECISION NOT NULL
);

-- name: migration_3
-- Idempotency-Key submits: see schema.sql.
CREATE TABLE idempotency_keys (
    tenant       TEXT COLLATE "C" NOT NULL,
    key          TEXT COLLATE "C" NOT NULL,
    request_hash TEXT NOT NULL,
    prompt_id    TEXT NOT NULL,
    answer       TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
-- name: migration_4
-- The webhook outbox (see sqlite_schema.sql and postgres_queries.sql). Server-wide targets,
-- mirrored from the config without their secrets; NULL events or tenants: every one.
CREATE TABLE webhook_targets (
    name    TEXT COLLATE "C" PRIMARY KEY,
    url     TEXT NOT NULL,
    events  TEXT[],
    tenants TEXT[]
);

CREATE TABLE webhook_deliveries (
    pos          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           TEXT COLLATE "C" NOT NULL UNIQUE,
    prompt_id    TEXT COLLATE "C" NOT NULL,
    tenant       TEXT COLLATE "C" NOT NULL,
    event        TEXT COLLATE "C" NOT NULL,
    target       TEXT COLLATE "C",
    url          TEXT NOT NULL,
    state        TEXT COLLATE "C" NOT NULL,
    attempts     BIGINT NOT NULL DEFAULT 0,
    created_at   DOUBLE PRECISION NOT NULL,
    retry_since  DOUBLE PRECISION NOT NULL,
    next_at      DOUBLE PRECISION NOT NULL,
    lease        TEXT COLLATE "C",
    lease_until  DOUBLE PRECISION NOT NULL DEFAULT 0,
    delivered_at DOUBLE PRECISION,
    last_status  INTEGER,
    last_error   TEXT,
    body         TEXT,
    updated_at   DOUBLE PRECISION NOT NULL
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at, pos) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_state ON webhook_deliveries (state, pos);
CREATE INDEX webhook_deliveries_prompt ON webhook_deliveries (prompt_id);

-- name: migration_5
-- Each prompt's client stream, as followers read it back (subscribe, SSE): `id` grows
-- with every append and is never reused, so a follower resumes after the last id it saw.
-- Not tied to jobs: retention prunes it on its own clock.
CREATE TABLE event_log (
    id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prompt_id TEXT COLLATE "C" NOT NULL,
    type      TEXT NOT NULL,
    data      TEXT NOT NULL,
    at        DOUBLE PRECISION NOT NULL
);

CREATE INDEX event_log_prompt ON event_log (prompt_id, id);
CREATE INDEX event_log_at ON event_log (at);

-- name: migration_6
-- Which gateway dispatches to each ComfyUI backend (see schema.sql): owned while that
-- gateway's lease holds; the row, and the backend's fleet-wide client id, outlive it.
CREATE TABLE backend_owners (
    backend   TEXT COLLATE "C" PRIMARY KEY,
    client_id TEXT NOT NULL,
    owner     TEXT COLLATE "C",
    since     DOUBLE PRECISION NOT NULL
);

-- name: migration_7
-- Remote-job owners: one journal for every gateway (see postgres_parts/journal_sql.py). Older jobs
-- have no owner (orphans any gateway may take over); of several live jobs for one request
-- (from before), the sent and newest one is kept and the others end; then a request has at
-- most one live job, and the gateways waiting on another's job are recorded.
ALTER TABLE remote_jobs ADD COLUMN owner TEXT COLLATE "C";

UPDATE remote_jobs SET state = 'failed', finished_at = updated_at,
    error = '{"class":"Superseded","message":"another job for the same request was live when the journal became shared; this one is no longer followed","status":null}'
WHERE state IN ('submitting', 'running') AND id <> (
    SELECT k.id FROM remote_jobs k
    WHERE k.request_hash = remote_jobs.request_hash AND k.state IN ('submitting', 'running')
    ORDER BY k.remote_id IS NOT NULL DESC, k.created_at DESC, k.pos DESC LIMIT 1);

CREATE UNIQUE INDEX remote_jobs_one_live ON remote_jobs (request_hash)
    WHERE state IN ('submitting', 'running');

CREATE TABLE remote_job_waiters (
    job_id  TEXT COLLATE "C" NOT NULL,
    gateway TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (job_id, gateway)
);

-- name: migration_8
-- Secrets the gateways sharing the database agree on (the key signing their requests to
-- each other): see postgres_parts/fleet_keys_sql.py.
CREATE TABLE fleet_keys (
    name       TEXT COLLATE "C" PRIMARY KEY,
    key        BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

-- name: migration_9
-- Binary frames (previews, progress text) in the event log: their bytes in a column of
-- their own, NULL for a JSON frame.
ALTER TABLE event_log ADD COLUMN frame bytea;


-- name: migration_10
-- Admission against the pending limit, for every gateway of the database at once (see
-- `submit` in postgres.py). Far from the limit a submit holds the admission lock shared
-- (submits run side by side); near it, exclusively (one at a time, counting only once
-- every other admitted submit has committed). Each count is a statement of its own in
-- a volatile function, so it reads what committed before the lock was granted.
CREATE OR REPLACE FUNCTION comfyfleet_admit_far(lim bigint, margin bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1668246374, hashtext(current_schema()));
    RETURN (SELECT count(*) FROM jobs WHERE status = 'pending') + margin < lim;
END $$;

CREATE OR REPLACE FUNCTION comfyfleet_admit_near(lim bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1668246374, hashtext(current_schema()));
    RETURN (SELECT count(*) FROM jobs WHERE status = 'pending') < lim;
END $$;

-- name: migration_11
-- A work wake-up's payload, made in one place for every statement that notifies:
-- `OWNER FRONT ORDER_KEY SEQ` (FRONT 0 for a front job, else 1), read by parse_work in
-- postgres.py. Its own float setting: the key is written shortest-exact, whatever the
-- server's extra_float_digits.
CREATE OR REPLACE FUNCTION comfyfleet_work_payload(
    gateway text, front boolean, order_key double precision, seq bigint
) RETURNS text
LANGUAGE sql IMMUTABLE SET extra_float_digits = 1 AS $$
    SELECT gateway || ' ' || CASE WHEN front THEN 0 ELSE 1 END || ' ' || order_key || ' ' || seq
$$;

-- name: migration_12
-- Output name counters every gateway shares: two gateways never give two files one
-- name (see sqlite_parts/file_counters_sql.py).
CREATE TABLE file_counters (
    key  TEXT COLLATE "C" PRIMARY KEY,
    next BIGINT NOT NULL
);

-- name: migration_13
-- Comfy API v2 assets: a tenant's named references to bytes kept by their blake3 hash
-- (see postgres_parts/assets.py).
CREATE TABLE assets (
    tenant       TEXT COLLATE "C" NOT NULL,
    id           TEXT COLLATE "C" NOT NULL,
    hash         TEXT COLLATE "C" NOT NULL,
    size         BIGINT NOT NULL,
    content_type TEXT NOT NULL,
    file_path    TEXT NOT NULL,
    blob         TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX assets_by_hash ON assets (tenant, hash, created_at);

-- name: migration_14
-- A tenant's claimable queue in dispatch order, for fair share's claims (shares/picking.py).
CREATE INDEX IF NOT EXISTS jobs_tenant_claimable ON jobs (tenant, front DESC, order_key, seq)
    WHERE status = 'pending' AND lane IS NULL;

-- name: migration_15
-- A tenant's cap on pending jobs (`max_queued`), for every gateway of the database at
-- once: a capped submit takes its tenant's admission lock (exclusive, so a tenant's
-- capped submits queue one after another while other tenants' run side by side) and
-- counts only then; the count is a statement of its own in a volatile function, so it
-- reads every submit that committed before the lock was granted. NULL: no cap, no lock.
-- Taken before the pending limit's lock (migration_10), always in that order. The index
-- (SQLite's of the same name) keeps the count to the tenant's own pending jobs, reserved
-- ones too (jobs_tenant_claimable leaves them out); it is a tenant's queue in dispatch
-- order, not (tenant) alone: the planner took that smaller index for claims, sorting the
-- whole queue, while the table had no statistics.
CREATE INDEX IF NOT EXISTS jobs_tenant_dispatch ON jobs (tenant, front DESC, order_key, seq)
    WHERE status = 'pending';

CREATE OR REPLACE FUNCTION comfyfleet_admit_tenant(who text, lim bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF lim IS NULL THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(1952804449, hashtext(current_schema() || '/' || who));
    RETURN (SELECT count(*) FROM jobs WHERE status = 'pending' AND tenant = who) < lim;
END $$;

-- name: migration_16
-- Budgets of paid jobs (comfyfleet/spend): whose prompt asked for each journaled job, its
-- model and its cost (NULL for older jobs: they count for no tenant). A new job of a
-- budgeted prompt takes its tenant's budget lock (exclusive: that tenant's new jobs are
-- recorded one after another, other tenants' side by side), then counts in statements
-- of their own, so every job committed before the lock was granted is counted.
ALTER TABLE remote_jobs
    ADD COLUMN IF NOT EXISTS tenant TEXT COLLATE "C",
    ADD COLUMN IF NOT EXISTS model TEXT,
    ADD COLUMN IF NOT EXISTS cost DOUBLE PRECISION;
CREATE INDEX IF NOT EXISTS remote_jobs_tenant ON remote_jobs (tenant, created_at)
    WHERE tenant IS NOT NULL;
CREATE INDEX IF NOT EXISTS remote_jobs_prompt ON remote_jobs (prompt_id);

CREATE OR REPLACE FUNCTION comfyfleet_paid_lock(who text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1885430116, hashtext(current_schema() || '/' || who));
END $$;

-- name: migration_17
-- What prompts run on backends may spend or spent, by backend (comfyfleet/spend/holds.py):
-- a backend's journal counts their paid jobs; here they count for the tenant's budget of
-- the day, held at the allowance granted until the backend says what it spent (settled).
-- Granted under the tenant's budget lock (migration_16).
CREATE TABLE IF NOT EXISTS paid_job_holds (
    prompt_id  TEXT COLLATE "C" NOT NULL,
    backend    TEXT COLLATE "C" NOT NULL,
    tenant     TEXT COLLATE "C" NOT NULL,
    paid_jobs  BIGINT NOT NULL,
    spend      DOUBLE PRECISION NOT NULL,
    settled    BOOLEAN NOT NULL DEFAULT FALSE,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (prompt_id, backend)
);
CREATE INDEX IF NOT EXISTS paid_job_holds_tenant ON paid_job_holds (tenant, created_at);

-- name: migration_18
-- The nodes of lanes only one gateway reaches (a worker's), for the other gateways of the
-- database (postgres_parts/published_nodes.py): each node set once, by its sha256.
CREATE TABLE IF NOT EXISTS node_sets (
    digest     TEXT COLLATE "C" PRIMARY KEY,
    node_set   BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS published_lanes (
    lane         TEXT COLLATE "C" PRIMARY KEY,
    gateway      TEXT COLLATE "C" NOT NULL,
    digest       TEXT COLLATE "C" NOT NULL,
    published_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS published_lanes_digest ON published_lanes (digest);
