-- The comfyfleet SQLite job store's schema (PRAGMA user_version holds a file's version),
-- as named blocks (see sql_blocks.py): migration_N takes a version N-1 file to version N.
-- A fresh file runs every block in order, so each table is defined here once. Blocks after
-- the first say IF NOT EXISTS: they may meet a file that already holds what they add.
-- Columns added to a table later are added by the Python step of their version (sqlite.py
-- MIGRATIONS), which checks for them first.
-- JSON columns hold compact JSON text; times are Unix seconds (REAL).

-- name: migration_1
CREATE TABLE jobs (
    prompt_id   TEXT PRIMARY KEY,
    -- Submission order, assigned by the store; never reused while the row exists.
    seq         INTEGER NOT NULL UNIQUE,
    -- The number exactly as given (24 stays an int, 100.0 a float) ...
    number_json TEXT NOT NULL,
    -- ... and the key dispatch sorts on: the number, or 0 for front jobs, which
    -- run FIFO among themselves before all others.
    order_key   REAL NOT NULL,
    front       INTEGER NOT NULL,
    status      TEXT NOT NULL,
    client_id   TEXT,
    prompt      TEXT NOT NULL,
    extra_data  TEXT NOT NULL,
    outputs     TEXT NOT NULL,   -- outputs_to_execute
    node_errors TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0,
    lane        TEXT,
    created_at  REAL NOT NULL,
    started_at  REAL,
    finished_at REAL,
    error       TEXT
    -- tenant (version 4) and owner (version 5) are added by those versions' upgrades
);

-- Claim and the pending queue read this index in order, no sort step.
CREATE INDEX jobs_dispatch ON jobs (front DESC, order_key, seq) WHERE status = 'pending';
CREATE INDEX jobs_running ON jobs (started_at, seq) WHERE status = 'running';
CREATE INDEX jobs_created ON jobs (created_at, seq);
-- Serves counts() and status-filtered job listings.
CREATE INDEX jobs_status ON jobs (status, created_at, seq);
-- Retention finds old finished jobs without walking every finished job.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE history (
    -- Completion order; AUTOINCREMENT so a deleted entry's position is never reused.
    pos          INTEGER PRIMARY KEY AUTOINCREMENT,
    prompt_id    TEXT NOT NULL UNIQUE REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    status       TEXT NOT NULL,
    outputs      TEXT NOT NULL,  -- node id -> ui
    meta         TEXT NOT NULL,
    completed_at REAL NOT NULL
);

CREATE INDEX history_completed ON history (completed_at);

-- The messages each attempt recorded, in order (a history entry's status.messages).
CREATE TABLE events (
    prompt_id TEXT NOT NULL REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    attempt   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    type      TEXT NOT NULL,
    data      TEXT NOT NULL,
    PRIMARY KEY (prompt_id, attempt, seq)
) WITHOUT ROWID;

-- Files a job wrote, so retention can delete them with the job.
CREATE TABLE outputs (
    prompt_id TEXT NOT NULL REFERENCES jobs (prompt_id) ON DELETE CASCADE,
    filename  TEXT NOT NULL,
    subfolder TEXT NOT NULL,
    type      TEXT NOT NULL
);

CREATE INDEX outputs_job ON outputs (prompt_id);

-- Small store-wide values, e.g. the submission counter's floor once jobs are pruned.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value
) WITHOUT ROWID;

-- name: migration_2
-- ComfyUI backends added at run time (the admin API); config-file backends are not stored.
CREATE TABLE IF NOT EXISTS backends (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;

-- name: migration_3
-- The journal of paid remote jobs (fan-out and provider nodes). A row is written
-- before the job-creating request, gets the provider's id right after, and keeps
-- the downloaded result, so a restart re-attaches instead of paying again. Not
-- tied to jobs: a result stays reusable after its prompt is pruned.
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
    resume       TEXT NOT NULL,  -- how to find the job again: endpoint, key reference (never a key)
    error        TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    result       BLOB,
    result_type  TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    finished_at  REAL
    -- owner (version 10): the gateway that sends and polls it (gateways.id)
);

CREATE INDEX IF NOT EXISTS remote_jobs_request ON remote_jobs (request_hash, state, created_at);
CREATE INDEX IF NOT EXISTS remote_jobs_live ON remote_jobs (created_at)
    WHERE state IN ('submitting', 'running');
CREATE INDEX IF NOT EXISTS remote_jobs_finished ON remote_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- name: migration_4
-- A tenant's jobs, for listings scoped to one tenant.
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant, created_at, seq);

-- name: migration_5
-- The gateways sharing this store, each with the lease that covers the jobs it runs
-- (jobs.owner); see sqlite_parts/leases_sql.py.
CREATE TABLE IF NOT EXISTS gateways (
    id          TEXT PRIMARY KEY,
    instance    TEXT NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    url         TEXT NOT NULL,
    started_at  REAL NOT NULL,
    seen_at     REAL NOT NULL,
    lease_until REAL NOT NULL
) WITHOUT ROWID;

-- name: migration_6
-- Idempotency-Key submits: a tenant's key, a digest of its request and the answer it got,
-- written in the transaction that inserts the job. A key older than 24 hours is free
-- again (see comfyfleet.domain.idempotency). Not tied to jobs: the answer outlives a
-- pruned job for the rest of its window.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant       TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    prompt_id    TEXT NOT NULL,
    answer       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created_at);

-- name: migration_7
-- Server-wide webhooks ([[webhooks]] in the config, without their secrets), mirrored at
-- start so a job's end finds its targets in the same transaction. events and tenants:
-- space-delimited words with a space at each end; NULL for every one.
CREATE TABLE IF NOT EXISTS webhook_targets (
    name    TEXT PRIMARY KEY,
    url     TEXT NOT NULL,
    events  TEXT,
    tenants TEXT
) WITHOUT ROWID;

-- The webhook outbox: one row per job end and target, written with the end (see
-- sqlite_parts/webhooks_sql.py). `id` is the webhook-id every attempt carries; a sender leases a
-- row (lease, lease_until) while it sends. Not tied to jobs: a delivery outlives
-- retention, and `body` keeps what was first sent.
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    pos          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    prompt_id    TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    event        TEXT NOT NULL,
    target       TEXT,           -- a webhook_targets name; NULL: the job's own webhook_url
    url          TEXT NOT NULL,
    state        TEXT NOT NULL,  -- pending, delivered or dead
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    retry_since  REAL NOT NULL,
    next_at      REAL NOT NULL,
    lease        TEXT,
    lease_until  REAL NOT NULL DEFAULT 0,
    delivered_at REAL,
    last_status  INTEGER,
    last_error   TEXT,
    body         TEXT,
    updated_at   REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (next_at, pos) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS webhook_deliveries_state ON webhook_deliveries (state, pos);
CREATE INDEX IF NOT EXISTS webhook_deliveries_prompt ON webhook_deliveries (prompt_id);

-- name: migration_8
-- Each prompt's client stream, as followers read it back (subscribe, SSE): `id` grows
-- with every append and is never reused (AUTOINCREMENT), so a follower resumes after
-- the last id it saw. Not tied to jobs: retention prunes it on its own clock. A binary
-- frame (preview, progress text) has its bytes in `frame` (NULL for a JSON frame).
CREATE TABLE IF NOT EXISTS event_log (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    prompt_id TEXT NOT NULL,
    type      TEXT NOT NULL,
    data      TEXT NOT NULL,
    at        REAL NOT NULL
    -- frame (version 12): a binary frame's bytes
);

CREATE INDEX IF NOT EXISTS event_log_prompt ON event_log (prompt_id, id);
CREATE INDEX IF NOT EXISTS event_log_at ON event_log (at);

-- name: migration_9
-- Which gateway dispatches to each ComfyUI backend (by name): owned while that
-- gateway's lease (the gateways table) holds, free otherwise. The row outlives its
-- owner: `client_id` is the clientId every owner of the backend uses, fleet-wide.
CREATE TABLE IF NOT EXISTS backend_owners (
    backend   TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    owner     TEXT,
    since     REAL NOT NULL
) WITHOUT ROWID;

-- name: migration_10
-- Single flight across gateways: one live job per request; the others wait on it.
CREATE UNIQUE INDEX IF NOT EXISTS remote_jobs_one_live ON remote_jobs (request_hash)
    WHERE state IN ('submitting', 'running');

-- The gateways that wait on another gateway's live job: its owner hands it to one of
-- them rather than cancel it (see sqlite_parts/journal_sql.py, release).
CREATE TABLE IF NOT EXISTS remote_job_waiters (
    job_id  TEXT NOT NULL,
    gateway TEXT NOT NULL,
    PRIMARY KEY (job_id, gateway)
) WITHOUT ROWID;

-- name: migration_11
-- Secrets the gateways sharing this store agree on (the key signing their requests to
-- each other): the first stored wins; see sqlite_parts/fleet_keys_sql.py.
CREATE TABLE IF NOT EXISTS fleet_keys (
    name       TEXT PRIMARY KEY,
    key        BLOB NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;

-- name: migration_13
-- Output name counters every gateway shares; see sqlite_parts/file_counters_sql.py.
CREATE TABLE IF NOT EXISTS file_counters (
    key  TEXT PRIMARY KEY,
    next INTEGER NOT NULL
) WITHOUT ROWID;

-- name: migration_14
-- Comfy API v2 assets: a tenant's named references to bytes kept by their blake3 hash
-- (see sqlite_parts/assets.py).
CREATE TABLE IF NOT EXISTS assets (
    tenant       TEXT NOT NULL,
    id           TEXT NOT NULL,
    hash         TEXT NOT NULL,
    size         INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    file_path    TEXT NOT NULL,
    blob         TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS assets_by_hash ON assets (tenant, hash, created_at);

-- name: migration_15
-- A tenant's queue in dispatch order, for fair share's claims (shares/picking.py).
CREATE INDEX IF NOT EXISTS jobs_tenant_dispatch ON jobs (tenant, front DESC, order_key, seq)
    WHERE status = 'pending';

-- name: migration_16
-- Budgets of paid jobs (comfyfleet/spend): a tenant's jobs of the day and a prompt's jobs
-- are counted from the journal. The columns (tenant, model, cost) are added by the Python
-- step of this version (sqlite_parts/journal_sql.py, add_budget_columns).
CREATE INDEX IF NOT EXISTS remote_jobs_tenant ON remote_jobs (tenant, created_at)
    WHERE tenant IS NOT NULL;
CREATE INDEX IF NOT EXISTS remote_jobs_prompt ON remote_jobs (prompt_id);

-- name: migration_17
-- What prompts run on backends may spend or spent, by backend (comfyfleet/spend/holds.py):
-- a backend's journal counts their paid jobs; here they count for the tenant's budget of
-- the day, held at the allowance granted until the backend says what it spent (settled).
CREATE TABLE IF NOT EXISTS paid_job_holds (
    prompt_id  TEXT NOT NULL,
    backend    TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    paid_jobs  INTEGER NOT NULL,
    spend      REAL NOT NULL,
    settled    INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    PRIMARY KEY (prompt_id, backend)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS paid_job_holds_tenant ON paid_job_holds (tenant, created_at);

-- name: migration_18
-- What a claim reads: pending jobs not set aside for a lane, in dispatch order (the
-- queue's own index, jobs_dispatch, also holds those set aside: with a thousand busy
-- backends each holding the next job, every claim stepped over all of them).
CREATE INDEX IF NOT EXISTS jobs_claimable ON jobs (front DESC, order_key, seq)
    WHERE status = 'pending' AND lane IS NULL;
CREATE INDEX IF NOT EXISTS jobs_tenant_claimable ON jobs (tenant, front DESC, order_key, seq)
    WHERE status = 'pending' AND lane IS NULL;

-- name: migration_19
-- The nodes of lanes only one gateway reaches (a worker's), for the other gateways of the
-- store (sqlite_parts/published_nodes.py): each node set once, by its sha256.
CREATE TABLE IF NOT EXISTS node_sets (
    digest     TEXT PRIMARY KEY,
    node_set   BLOB NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS published_lanes (
    lane         TEXT PRIMARY KEY,
    gateway      TEXT NOT NULL,
    digest       TEXT NOT NULL,
    published_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS published_lanes_digest ON published_lanes (digest);
