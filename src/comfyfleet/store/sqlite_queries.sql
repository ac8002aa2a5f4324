-- comfyfleet job store on SQLite: every statement, by name (see sql_blocks.py); the
-- tables are in sqlite_schema.sql. A statement with `{marks}` takes a list of `?` for an
-- `IN (...)` (see sqlite.py `_marks`).


-- == jobs, queue and history ==================================================

-- name: count_pending
-- Pending jobs (the dispatch index holds exactly them).
SELECT count(*) FROM jobs WHERE status = 'pending'

-- name: count_pending_of
-- A tenant's pending jobs (reserved ones too: they have not started), for its cap.
SELECT count(*) FROM jobs INDEXED BY jobs_tenant_dispatch WHERE status = 'pending' AND tenant = ?

-- name: insert_job
INSERT INTO jobs (prompt_id, seq, number_json, order_key, front, status, client_id,
                  prompt, extra_data, outputs, node_errors, created_at, tenant)
VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM jobs), ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)
RETURNING seq

-- name: claim_job
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = ?, started_at = ?, owner = ?
WHERE prompt_id = ? AND status = 'pending'

-- name: claim_candidate
-- Fenced: only while the job is still claimable at the attempt its candidate had.
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = ?, started_at = ?, owner = ?
WHERE prompt_id = ? AND status = 'pending' AND lane IS NULL AND attempt = ?

-- name: claim_candidate_capped
-- As claim_candidate, while the job's tenant runs fewer jobs than the last parameter
-- (its max_running): one writer at a time, so the count cannot go stale before the update.
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = ?, started_at = ?, owner = ?
WHERE prompt_id = ? AND status = 'pending' AND lane IS NULL AND attempt = ?
  AND (SELECT count(*) FROM jobs AS r INDEXED BY jobs_running
       WHERE r.status = 'running' AND r.tenant = jobs.tenant) < ?

-- name: reserve_candidate
-- A reserved job stays pending, set aside for the lane named in `lane`; fenced as above.
UPDATE jobs SET lane = ?, owner = ?
WHERE prompt_id = ? AND status = 'pending' AND lane IS NULL AND attempt = ?

-- name: start_reserved
-- `lane IS ?`: a job set aside for no lane (NULL) is started the same way.
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = ?, started_at = ?, owner = ?
WHERE prompt_id = ? AND status = 'pending' AND lane IS ?

-- name: unreserve_job
UPDATE jobs SET lane = NULL, owner = NULL WHERE prompt_id = ? AND status = 'pending'

-- name: finish_job
UPDATE jobs SET status = ?, finished_at = ?, error = ?
WHERE prompt_id = ? AND status = 'running' AND attempt = ?

-- name: insert_history
INSERT INTO history (prompt_id, status, outputs, meta, completed_at) VALUES (?, ?, ?, ?, ?)

-- name: insert_event
INSERT INTO events (prompt_id, attempt, seq, type, data) VALUES (?, ?, ?, ?, ?)

-- name: insert_output
INSERT INTO outputs (prompt_id, filename, subfolder, type) VALUES (?, ?, ?, ?)

-- name: attempt_notes_of
SELECT prompt_id, attempt, data FROM events WHERE prompt_id IN ({marks}) AND type = 'requeued'
ORDER BY prompt_id, attempt

-- name: requeue_job
UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
WHERE prompt_id = ? AND status = 'running' AND attempt = ?

-- name: requeue_lane
-- This gateway's jobs, and orphaned ones: never another live gateway's.
UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
WHERE status = 'running' AND substr(lane, 1, ?) = ? AND (owner = ? OR status = 'running' AND 
(owner IS NULL OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= ?))
)
RETURNING prompt_id, seq

-- name: cancel_job
UPDATE jobs SET status = 'cancelled', finished_at = ?
WHERE prompt_id = ? AND status IN ('pending', 'running')

-- name: cancel_pending_job
UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE prompt_id = ? AND status = 'pending'

-- name: cancel_pending
UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE status = 'pending'
RETURNING prompt_id, seq

-- name: delete_history
DELETE FROM history WHERE prompt_id = ?

-- name: clear_history
DELETE FROM history

-- name: delete_job
-- Child rows (history, events, outputs) go with the job: ON DELETE CASCADE.
DELETE FROM jobs WHERE prompt_id = ?

-- name: save_number_floor
INSERT INTO meta (key, value) VALUES ('number_floor', ?)
ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)

-- name: select_job
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs WHERE prompt_id = ?

-- name: select_pending
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_dispatch WHERE status = 'pending'
ORDER BY front DESC, order_key, seq LIMIT ?

-- name: select_claimable
-- What a claim may take: pending and not reserved; a later page starts past the last
-- job of the one before, by dispatch key (front DESC, order_key, seq).
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_claimable WHERE status = 'pending' AND lane IS NULL
ORDER BY front DESC, order_key, seq LIMIT ?

-- name: select_claimable_after
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_claimable WHERE status = 'pending' AND lane IS NULL
  AND (front < ? OR (front = ? AND (order_key > ? OR (order_key = ? AND seq > ?))))
ORDER BY front DESC, order_key, seq LIMIT ?

-- name: select_claimable_of
-- A tenant's claimable jobs (fair share: see shares/picking.py), in dispatch order.
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_tenant_claimable WHERE tenant = ? AND status = 'pending' AND lane IS NULL
ORDER BY front DESC, order_key, seq LIMIT ?

-- name: select_claimable_of_after
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_tenant_claimable WHERE tenant = ? AND status = 'pending' AND lane IS NULL
  AND (front < ? OR (front = ? AND (order_key > ? OR (order_key = ? AND seq > ?))))
ORDER BY front DESC, order_key, seq LIMIT ?

-- name: pending_key
-- A pending job's dispatch key and tenant, for its queue position.
SELECT front, order_key, seq, tenant FROM jobs WHERE prompt_id = ? AND status = 'pending'

-- name: count_ahead
-- Pending jobs ahead of the key (front, order_key, seq), counted up to a limit: the front
-- jobs before a plain one, then those of its own front-ness before it, each a range of
-- the index (an OR of both would walk the whole queue).
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_dispatch
         WHERE status = 'pending' AND front > ?1 LIMIT ?4))
     + (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_dispatch
         WHERE status = 'pending' AND front = ?1 AND (order_key, seq) < (?2, ?3) LIMIT ?4))

-- name: count_ahead_of
-- As count_ahead, among one tenant's (?5) pending jobs.
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_tenant_dispatch
         WHERE tenant = ?5 AND status = 'pending' AND front > ?1 LIMIT ?4))
     + (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_tenant_dispatch
         WHERE tenant = ?5 AND status = 'pending' AND front = ?1
           AND (order_key, seq) < (?2, ?3) LIMIT ?4))

-- name: tenant_counts
-- Per tenant: claimable jobs, running ones, and when its oldest claimable one came.
SELECT tenant, sum(status = 'pending' AND lane IS NULL), sum(status = 'running'),
       min(CASE WHEN status = 'pending' AND lane IS NULL THEN created_at END)
FROM jobs WHERE status IN ('pending', 'running') GROUP BY tenant

-- name: select_running
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_running WHERE status = 'running'
ORDER BY started_at, seq

-- name: count_statuses
SELECT status, count(*) FROM jobs GROUP BY status

-- name: history_oldest_first
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs, j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at, j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
 ORDER BY h.pos LIMIT ? OFFSET ?

-- name: history_newest_first
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs, j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at, j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
 ORDER BY h.pos DESC LIMIT ?

-- name: history_one
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs, j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at, j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
 WHERE h.prompt_id = ?

-- name: events_of
-- Only the messages of the attempt that finished the job make its history entry.
SELECT e.prompt_id, e.type, e.data FROM events e
JOIN jobs j ON j.prompt_id = e.prompt_id AND j.attempt = e.attempt
WHERE e.prompt_id IN ({marks}) ORDER BY e.prompt_id, e.seq

-- name: outputs_of
SELECT prompt_id, filename, subfolder, type FROM outputs
WHERE prompt_id IN ({marks}) ORDER BY rowid

-- name: max_counted_number
-- Integer-valued numbers came from the counter (front jobs store it negated);
-- explicit numbers are floats and do not move the counter, as in ComfyUI.
SELECT max(abs(CAST(number_json AS INTEGER))) FROM jobs WHERE number_json NOT GLOB '*[^0-9-]*'

-- name: select_number_floor
SELECT value FROM meta WHERE key = 'number_floor'

-- name: history_at_rank
-- Retention: the entry at the count limit, and what lies before a horizon.
SELECT pos, completed_at FROM history ORDER BY pos DESC LIMIT 1 OFFSET ?

-- name: history_before
SELECT prompt_id FROM history WHERE pos <= ? OR completed_at < ? ORDER BY pos

-- name: unlisted_before
SELECT prompt_id FROM jobs j INDEXED BY jobs_finished
WHERE finished_at < ? AND status IN ('cancelled', 'error', 'interrupted', 'success')
  AND NOT EXISTS (SELECT 1 FROM history h WHERE h.prompt_id = j.prompt_id)
ORDER BY finished_at, seq

-- name: select_pending_of
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_dispatch WHERE status = 'pending' AND tenant = ?
ORDER BY front DESC, order_key, seq

-- name: select_running_of
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs INDEXED BY jobs_running WHERE status = 'running' AND tenant = ?
ORDER BY started_at, seq

-- name: count_active_of
SELECT count(*) FROM jobs INDEXED BY jobs_status
WHERE status IN ('pending', 'running') AND tenant = ?

-- name: history_of_oldest_first
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs, j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at, j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
 WHERE j.tenant = ? ORDER BY h.pos LIMIT ? OFFSET ?

-- name: history_of_newest_first
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs, j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at, j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
 WHERE j.tenant = ? ORDER BY h.pos DESC LIMIT ?

-- name: clear_history_of
DELETE FROM history WHERE prompt_id IN (SELECT prompt_id FROM jobs WHERE tenant = ?)

-- name: owned
SELECT prompt_id FROM jobs WHERE tenant = ? AND prompt_id IN ({marks})

-- name: tenants_of
SELECT prompt_id, tenant FROM jobs WHERE prompt_id IN ({marks})


-- name: ping
SELECT 1

-- name: select_backends
-- Backends added at run time, in the order they were added.
SELECT spec FROM backends ORDER BY created_at, name

-- name: save_backend
INSERT INTO backends (name, spec, created_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec

-- name: delete_backend
DELETE FROM backends WHERE name = ?

-- == remote-job journal =======================================================

-- name: journal_end_duplicates
-- Version 9: owners, one live job per request, and who waits on whose job.
-- Live jobs that share a request with a newer (or sent) live one, from before owners:
-- the one kept is followed, the others end. `?`: the error recorded.
UPDATE remote_jobs SET state = 'failed', error = ?, finished_at = updated_at
WHERE state IN ('submitting', 'running') AND id <> (
    SELECT k.id FROM remote_jobs k
    WHERE k.request_hash = remote_jobs.request_hash AND k.state IN ('submitting', 'running')
    ORDER BY k.remote_id IS NOT NULL DESC, k.created_at DESC, k.rowid DESC LIMIT 1)

-- name: journal_insert
-- A new job, unless its request has a live one (then no row): one statement, because
-- each statement costs the writer thread a wait for the interpreter lock, and this one
-- stands between a free pool slot and the job-creating request.
INSERT INTO remote_jobs (id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, tenant, model, cost)
VALUES (?, ?, ?, ?, ?, ?, NULL, 'submitting', NULL, ?, NULL, 0, ?, ?, NULL, ?, ?, ?, ?)
ON CONFLICT (request_hash) WHERE state IN ('submitting', 'running') DO NOTHING
RETURNING id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, NULL, NULL

-- name: journal_submitted
UPDATE remote_jobs SET state = 'running', remote_id = ?, resume = ?, updated_at = ?
WHERE id = ? AND state IN ('submitting', 'running') AND owner IS ?

-- name: journal_finish
UPDATE remote_jobs
SET state = ?, result = ?, result_type = ?, error = ?, attempts = coalesce(?, attempts),
    updated_at = ?, finished_at = ?
WHERE id = ? AND state IN ('submitting', 'running') AND owner IS ?

-- name: journal_drop_waiters
DELETE FROM remote_job_waiters WHERE job_id = ?

-- name: journal_adopt
UPDATE remote_jobs SET owner = ?, updated_at = ?
WHERE id = ? AND state IN ('submitting', 'running') AND 
(owner IS NULL OR owner = ? OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = remote_jobs.owner AND g.lease_until >= ?))

-- name: journal_wait
INSERT OR IGNORE INTO remote_job_waiters (job_id, gateway) VALUES (?, ?)

-- name: journal_stop_waiting
DELETE FROM remote_job_waiters WHERE job_id = ? AND gateway = ?

-- name: journal_live_waiter
-- A live gateway other than the owner (`?`) that waits on the job, the latest seen first.
SELECT w.gateway FROM remote_job_waiters w JOIN gateways g ON g.id = w.gateway
WHERE w.job_id = ? AND w.gateway <> ? AND g.lease_until >= ?
ORDER BY g.seen_at DESC, g.id LIMIT 1

-- name: journal_hand_over
UPDATE remote_jobs SET owner = ?, updated_at = ? WHERE id = ? AND state IN ('submitting', 'running') AND owner IS ?

-- name: journal_select_live_for_hash
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, NULL, NULL FROM remote_jobs WHERE request_hash = ? AND state IN ('submitting', 'running')

-- name: journal_select_own_live
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, NULL, NULL FROM remote_jobs WHERE id = ? AND state IN ('submitting', 'running') AND owner IS ?

-- name: journal_assign_slot
UPDATE remote_jobs SET slot = ? WHERE id = ?

-- name: journal_select_one
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, result, result_type FROM remote_jobs WHERE id = ?

-- name: journal_select_live_one
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, NULL, NULL FROM remote_jobs WHERE id = ?

-- name: journal_select_reusable
-- For each request hash of a JSON array, its newest succeeded job (with its result), else
-- its newest job; a hash with no job has no row.
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner,
       CASE WHEN state = 'succeeded' THEN result END,
       CASE WHEN state = 'succeeded' THEN result_type END
FROM remote_jobs WHERE rowid IN (
    SELECT (SELECT rowid FROM remote_jobs AS newest WHERE newest.request_hash = wanted.value
            ORDER BY state = 'succeeded' DESC, created_at DESC, rowid DESC LIMIT 1)
    FROM json_each(?) AS wanted)

-- name: journal_select_live
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id, resume, error, attempts, created_at, updated_at, finished_at, owner, NULL, NULL FROM remote_jobs INDEXED BY remote_jobs_live
WHERE state IN ('submitting', 'running') AND 
(owner IS NULL OR owner = ? OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = remote_jobs.owner AND g.lease_until >= ?))
 ORDER BY created_at, rowid

-- name: journal_prune
DELETE FROM remote_jobs WHERE finished_at < ? AND state NOT IN ('submitting', 'running')

-- name: journal_prune_waiters
DELETE FROM remote_job_waiters
WHERE NOT EXISTS (SELECT 1 FROM remote_jobs r WHERE r.id = remote_job_waiters.job_id)


-- name: journal_exists
SELECT 1 FROM remote_jobs WHERE id = ?

-- name: journal_known_requests
-- Of some request hashes, those a new job would not be sent for: a succeeded job kept
-- its result (reused), or a live job runs it (waited on). `{marks}`: one ? per hash.
SELECT DISTINCT request_hash FROM remote_jobs
WHERE request_hash IN ({marks})
  AND (state IN ('submitting', 'running') OR (state = 'succeeded' AND result IS NOT NULL))

-- name: journal_paid_by_tenant
-- A tenant's paid jobs recorded since a time, and their cost: every job that may have
-- been billed (see comfyfleet/spend/budget.py). Not counted: a job that failed with no
-- remote id and no ambiguous submit (the provider refused it, or never got it).
-- Prompts run on backends count by their holds (paid_job_holds).
SELECT sum(n), sum(c) FROM (
    SELECT count(*) AS n, coalesce(sum(cost), 0.0) AS c FROM remote_jobs
    WHERE tenant = ?1 AND created_at >= ?2
      AND NOT (state = 'failed' AND remote_id IS NULL
               AND coalesce(json_extract(error, '$.class'), '') <> 'AmbiguousSubmit')
    UNION ALL
    SELECT coalesce(sum(paid_jobs), 0), coalesce(sum(spend), 0.0) FROM paid_job_holds
    WHERE tenant = ?1 AND created_at >= ?2)

-- name: journal_paid_by_prompt
-- One prompt's paid jobs and their cost, counted as journal_paid_by_tenant counts.
SELECT sum(n), sum(c) FROM (
    SELECT count(*) AS n, coalesce(sum(cost), 0.0) AS c FROM remote_jobs
    WHERE prompt_id = ?1
      AND NOT (state = 'failed' AND remote_id IS NULL
               AND coalesce(json_extract(error, '$.class'), '') <> 'AmbiguousSubmit')
    UNION ALL
    SELECT coalesce(sum(paid_jobs), 0), coalesce(sum(spend), 0.0) FROM paid_job_holds
    WHERE prompt_id = ?1)

-- name: journal_hold_of
-- A prompt's hold on one backend.
SELECT paid_jobs, spend, settled, created_at FROM paid_job_holds
WHERE prompt_id = ? AND backend = ?

-- name: journal_hold
-- A prompt's hold on one backend, set (a new grant replaces the last one's).
INSERT INTO paid_job_holds (prompt_id, backend, tenant, paid_jobs, spend, settled, created_at)
VALUES (?, ?, ?, ?, ?, 0, ?)
ON CONFLICT (prompt_id, backend) DO UPDATE SET
    tenant = excluded.tenant, paid_jobs = excluded.paid_jobs, spend = excluded.spend,
    settled = 0, created_at = excluded.created_at

-- name: journal_settle
-- What the prompt spent on the backend, which the hold now counts: never more than the
-- hold (the backend refuses jobs past its allowance; one that says otherwise is wrong).
UPDATE paid_job_holds SET paid_jobs = min(?, paid_jobs), spend = min(?, spend), settled = 1
WHERE prompt_id = ? AND backend = ?

-- name: journal_prune_holds
DELETE FROM paid_job_holds WHERE created_at < ?

-- == webhook outbox ===========================================================

-- name: webhook_enqueue
-- The job's own webhook: only looked for (JSON parsed) when its extra_data names one and
-- holds no escaped NUL (as on PostgreSQL, whose JSON functions fail on one).
INSERT INTO webhook_deliveries (id, prompt_id, tenant, event, target, url, state,
                                created_at, retry_since, next_at, updated_at)

SELECT 'msg_' || lower(hex(randomblob(16))), j.prompt_id, j.tenant, :event, NULL,
       json_extract(j.extra_data, '$.webhook_url'), 'pending', :now, :now, :now, :now
FROM jobs j
WHERE j.prompt_id = :prompt_id
  AND CASE WHEN instr(j.extra_data, '"webhook_url"') > 0
                AND instr(j.extra_data, '\u0000') = 0 THEN
        json_type(j.extra_data, '$.webhook_url') = 'text'
        AND (json_type(j.extra_data, '$.webhook_events') IS NOT 'array'
             OR EXISTS (SELECT 1 FROM json_each(j.extra_data, '$.webhook_events')
                        WHERE value = :event))
      ELSE 0 END
UNION ALL
SELECT 'msg_' || lower(hex(randomblob(16))), j.prompt_id, j.tenant, :event, t.name, t.url, 'pending', :now, :now, :now, :now
FROM jobs j, webhook_targets t
WHERE j.prompt_id = :prompt_id
  AND (t.events IS NULL OR instr(t.events, ' ' || :event || ' ') > 0)
  AND (t.tenants IS NULL OR instr(t.tenants, ' ' || j.tenant || ' ') > 0)

-- name: webhook_claim
UPDATE webhook_deliveries SET lease = :lease, lease_until = :until
WHERE pos IN (
    SELECT pos FROM webhook_deliveries INDEXED BY webhook_deliveries_due
    WHERE state = 'pending' AND next_at <= :now AND lease_until <= :now
    ORDER BY next_at, pos LIMIT :limit)
RETURNING id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since, next_at, delivered_at, last_status, last_error, body, lease

-- name: webhook_record
UPDATE webhook_deliveries
SET state = :state, attempts = attempts + 1, next_at = coalesce(:next_at, next_at),
    delivered_at = CASE WHEN :state = 'delivered' THEN :now ELSE delivered_at END,
    last_status = :status, last_error = :error, body = coalesce(body, :body),
    lease = NULL, lease_until = 0, updated_at = :now
WHERE id = :id AND lease = :lease

-- name: webhook_release
UPDATE webhook_deliveries SET next_at = ?, lease = NULL, lease_until = 0
WHERE id = ? AND lease = ?

-- name: webhook_select_one
SELECT id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since, next_at, delivered_at, last_status, last_error, body, lease FROM webhook_deliveries WHERE id = ?

-- name: webhook_retry
UPDATE webhook_deliveries
SET state = 'pending', next_at = :now, retry_since = :now, lease = NULL, lease_until = 0,
    updated_at = :now
WHERE id = :id AND state != 'pending'
RETURNING id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since, next_at, delivered_at, last_status, last_error, body, lease

-- name: webhook_prune
DELETE FROM webhook_deliveries WHERE state != 'pending' AND updated_at < ?


-- name: orphaned
-- Jobs a gateway that is gone held: running, or pending but set aside for its lane
-- (`?` is the time now).
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status, attempt, lane, created_at, started_at, finished_at, error, tenant, owner FROM jobs
WHERE (status = 'running' OR (status = 'pending' AND lane IS NOT NULL)) AND 
(owner IS NULL OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= ?))
ORDER BY started_at, seq

-- name: webhook_clear_targets
DELETE FROM webhook_targets

-- == prompt event log =========================================================

-- name: event_log_insert
INSERT INTO event_log (prompt_id, type, data, frame, at) VALUES (?, ?, ?, ?, ?)

-- name: event_log_select_after
SELECT id, type, data, at, frame FROM event_log INDEXED BY event_log_prompt
WHERE prompt_id = ? AND id > ? ORDER BY id LIMIT ?

-- name: event_log_select_client
SELECT tenant, client_id FROM jobs WHERE prompt_id = ?

-- name: event_log_prune
-- Prompts with an event older than the cutoff (found by time, so each prune reads only
-- what aged since the last), whose newest event is older too and whose job is over.
DELETE FROM event_log WHERE prompt_id IN (
    SELECT old.prompt_id
    FROM (SELECT DISTINCT prompt_id FROM event_log INDEXED BY event_log_at WHERE at < ?1) old
    WHERE (SELECT l.at FROM event_log l INDEXED BY event_log_prompt
           WHERE l.prompt_id = old.prompt_id ORDER BY l.id DESC LIMIT 1) < ?1
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.prompt_id = old.prompt_id
                      AND j.status IN ('pending', 'running'))
)


-- name: event_log_last_id
SELECT last_insert_rowid()

-- == gateways and leases ======================================================

-- name: lease_select_holder
SELECT id, instance, host, pid, url, started_at, seen_at, lease_until FROM gateways WHERE id = ?

-- name: lease_upsert_gateway
INSERT INTO gateways (id, instance, host, pid, url, started_at, seen_at, lease_until)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, host = excluded.host,
    pid = excluded.pid, url = excluded.url, started_at = excluded.started_at,
    seen_at = excluded.seen_at, lease_until = excluded.lease_until

-- name: lease_heartbeat
UPDATE gateways SET seen_at = ?, lease_until = ? WHERE id = ? AND instance = ?

-- name: lease_leave
DELETE FROM gateways WHERE id = ? AND instance = ?

-- name: lease_live_gateways
SELECT g.id, g.instance, g.host, g.pid, g.url, g.started_at, g.seen_at, g.lease_until,
       (SELECT count(*) FROM jobs j WHERE j.status = 'running' AND j.owner = g.id)
FROM gateways g WHERE g.lease_until >= ? ORDER BY g.id

-- name: lease_requeue_orphaned
UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
WHERE prompt_id = ? AND attempt = ? AND status = 'running' AND 
(owner IS NULL OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= ?))

-- name: lease_adopt
UPDATE jobs SET owner = ?, attempt = attempt + 1 WHERE prompt_id = ? AND attempt = ? AND status = 'running' AND 
(owner IS NULL OR NOT EXISTS (
    SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= ?))


-- == backend owners ===========================================================

-- name: backend_owner_lease_holds
-- Whether gateway `?` (instance `?`) holds its lease at time `?`.
SELECT 1 FROM gateways WHERE id = ? AND instance = ? AND lease_until >= ?

-- name: backend_owner_select_one
-- A backend's row, and its owner as recorded (whether live or not).
SELECT o.backend, o.client_id, 
CASE WHEN EXISTS (SELECT 1 FROM gateways g WHERE g.id = o.owner AND g.lease_until >= ?)
     THEN o.owner END
, o.since, o.owner FROM backend_owners o
WHERE o.backend = ?

-- name: backend_owner_select_all
SELECT o.backend, o.client_id, 
CASE WHEN EXISTS (SELECT 1 FROM gateways g WHERE g.id = o.owner AND g.lease_until >= ?)
     THEN o.owner END
, o.since FROM backend_owners o ORDER BY o.backend

-- name: backend_owner_insert
INSERT INTO backend_owners (backend, client_id, owner, since) VALUES (?, ?, ?, ?)

-- name: backend_owner_take
UPDATE backend_owners SET owner = ?, since = ? WHERE backend = ?

-- name: backend_owner_release
UPDATE backend_owners SET owner = NULL WHERE owner = ? AND backend = ?

-- name: backend_owner_release_all
UPDATE backend_owners SET owner = NULL WHERE owner = ?

-- name: backend_owner_forget
DELETE FROM backend_owners WHERE backend = ?


-- == idempotency keys =========================================================

-- name: idempotency_claim
-- A key older than the window is free again: the upsert takes its row over; a fresh
-- one is left alone and returns no row.
INSERT INTO idempotency_keys (tenant, key, request_hash, prompt_id, answer, created_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, key) DO UPDATE SET
    request_hash = excluded.request_hash, prompt_id = excluded.prompt_id,
    answer = excluded.answer, created_at = excluded.created_at
WHERE idempotency_keys.created_at <= ?
RETURNING 1

-- name: idempotency_first
SELECT key, request_hash, answer, created_at FROM idempotency_keys
WHERE tenant = ? AND key = ? AND created_at > ?

-- name: idempotency_forget_expired
-- Each keyed submit forgets a few expired keys, so the table holds about one window.
DELETE FROM idempotency_keys WHERE (tenant, key) IN (
    SELECT tenant, key FROM idempotency_keys WHERE created_at <= ? LIMIT 16
)


-- == fleet keys ===============================================================

-- name: fleet_key_keep_first
-- Version 9 adds the table; IF NOT EXISTS because a fresh file already has it.
INSERT INTO fleet_keys (name, key, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING

-- name: fleet_key_select_key
SELECT key FROM fleet_keys WHERE name = ?


-- == file counters ============================================================

-- name: file_counter_reserve
-- Version 13 adds the table; IF NOT EXISTS because a fresh file already has it.
INSERT INTO file_counters (key, next) VALUES (?1, ?2 + ?3)
ON CONFLICT (key) DO UPDATE SET next = max(file_counters.next, ?2) + ?3
RETURNING next - ?3

-- == Comfy API v2 assets =======================================================

-- name: asset_insert
INSERT INTO assets (tenant, id, hash, size, content_type, file_path, blob, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)

-- name: asset_select
SELECT id, tenant, hash, size, content_type, file_path, blob, created_at
FROM assets WHERE tenant = ? AND id = ?

-- name: asset_by_hash
SELECT id, tenant, hash, size, content_type, file_path, blob, created_at
FROM assets WHERE tenant = ? AND hash = ? ORDER BY created_at, id LIMIT 1

-- name: asset_delete
DELETE FROM assets WHERE tenant = ? AND id = ?


-- == published nodes ==========================================================
-- The nodes of lanes only one gateway reaches: see seams/published_nodes.py.

-- name: node_set_keep
-- Kept fresh: a set published again is not taken by a tidy-up under way (see node_sets_unused).
INSERT INTO node_sets (digest, node_set, created_at) VALUES (?1, ?2, ?3)
ON CONFLICT (digest) DO UPDATE SET created_at = excluded.created_at

-- name: published_lane_upsert
INSERT INTO published_lanes (lane, gateway, digest, published_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (lane) DO UPDATE SET gateway = excluded.gateway, digest = excluded.digest,
    published_at = excluded.published_at

-- name: published_lane_delete
DELETE FROM published_lanes WHERE lane = ?1 AND gateway = ?2

-- name: published_lanes_of_the_dead
-- Lanes of gateways gone (no lease for a minute): nobody reaches them any more.
DELETE FROM published_lanes WHERE gateway NOT IN (
    SELECT id FROM gateways WHERE lease_until >= ?1 - 60)

-- name: node_sets_unused
-- Only sets a minute old: one a gateway is publishing now is fresh (node_set_keep).
DELETE FROM node_sets
WHERE created_at < ?1 - 60 AND digest NOT IN (SELECT digest FROM published_lanes)

-- name: published_lanes_elsewhere
SELECT p.lane, p.digest FROM published_lanes p JOIN gateways g ON g.id = p.gateway
WHERE p.gateway <> ?1 AND g.lease_until >= ?2 ORDER BY p.lane

-- name: node_set_select
SELECT node_set FROM node_sets WHERE digest = ?1
