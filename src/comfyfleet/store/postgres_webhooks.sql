-- The webhook outbox on PostgreSQL: its statements, by name (see sql_blocks.py).
-- A delivery's columns come in one order (postgres_webhooks.py decodes them by position):
-- id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since,
-- next_at, delivered_at, last_status, last_error, body, lease.

-- name: webhook_deliveries
-- Not a statement: the CTE body that the job-ending statements (finish_job, cancel_jobs,
-- cancel_pending) put in place of `{webhook_deliveries}`, so the deliveries commit with
-- the end. It reads their CTE `job` (prompt_id, tenant, extra_data, event, at). The job's
-- own webhook is only looked for (JSON parsed) when its extra_data names one, and not at
-- all when it holds an escaped NUL anywhere: PostgreSQL's JSON functions fail on one
-- (POST /prompt refuses a webhook_url with such extra_data).
INSERT INTO webhook_deliveries (id, prompt_id, tenant, event, target, url, state,
                                created_at, retry_since, next_at, updated_at)
SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), job.prompt_id, job.tenant,
       job.event, NULL, job.extra_data::json ->> 'webhook_url', 'pending',
       job.at, job.at, job.at, job.at
FROM job
WHERE CASE WHEN strpos(job.extra_data, '"webhook_url"') > 0
               AND strpos(job.extra_data, '\u0000') = 0 THEN
          json_typeof(job.extra_data::json -> 'webhook_url') = 'string'
          AND CASE WHEN json_typeof(job.extra_data::json -> 'webhook_events') = 'array'
                   THEN EXISTS (
                       SELECT 1
                       FROM json_array_elements(job.extra_data::json -> 'webhook_events') e
                       WHERE e::text = to_json(job.event)::text)
                   ELSE true END
      ELSE false END
UNION ALL
SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), job.prompt_id, job.tenant,
       job.event, t.name, t.url, 'pending', job.at, job.at, job.at, job.at
FROM job JOIN webhook_targets t
    ON (t.events IS NULL OR job.event = ANY(t.events))
   AND (t.tenants IS NULL OR job.tenant = ANY(t.tenants))

-- name: clear_webhook_targets
DELETE FROM webhook_targets

-- name: add_webhook_target
INSERT INTO webhook_targets (name, url, events, tenants) VALUES ($1, $2, $3, $4)

-- name: claim_webhook_deliveries
-- Two gateways sharing the database never claim one delivery at once: rows another
-- claim holds are skipped, and the lease keeps them from the next claims until it ends.
UPDATE webhook_deliveries d SET lease = $3, lease_until = $4
WHERE d.pos IN (
    SELECT pos FROM webhook_deliveries
    WHERE state = 'pending' AND next_at <= $1 AND lease_until <= $1
    ORDER BY next_at, pos LIMIT $2
    FOR UPDATE SKIP LOCKED)
RETURNING id, prompt_id, tenant, event, target, url, state, attempts, created_at,
          retry_since, next_at, delivered_at, last_status, last_error, body, lease

-- name: record_webhook_attempt
UPDATE webhook_deliveries
SET state = $3, attempts = attempts + 1, next_at = coalesce($4, next_at),
    delivered_at = CASE WHEN $3 = 'delivered' THEN $5 ELSE delivered_at END,
    last_status = $6, last_error = $7, body = coalesce(body, $8),
    lease = NULL, lease_until = 0, updated_at = $5
WHERE id = $1 AND lease = $2
RETURNING true

-- name: release_webhook_delivery
UPDATE webhook_deliveries SET next_at = $3, lease = NULL, lease_until = 0
WHERE id = $1 AND lease = $2
RETURNING true

-- name: webhook_delivery
SELECT id, prompt_id, tenant, event, target, url, state, attempts, created_at,
       retry_since, next_at, delivered_at, last_status, last_error, body, lease
FROM webhook_deliveries WHERE id = $1

-- name: webhook_deliveries_page
-- Newest first; $1 a state or NULL (every state), $2 a prompt id or NULL.
SELECT id, prompt_id, tenant, event, target, url, state, attempts, created_at,
       retry_since, next_at, delivered_at, last_status, last_error, body, lease
FROM webhook_deliveries
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR prompt_id = $2)
ORDER BY pos DESC LIMIT $3 OFFSET $4

-- name: webhook_deliveries_total
SELECT count(*) FROM webhook_deliveries
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR prompt_id = $2)

-- name: retry_webhook_delivery
UPDATE webhook_deliveries
SET state = 'pending', next_at = $2, retry_since = $2, lease = NULL, lease_until = 0,
    updated_at = $2
WHERE id = $1 AND state != 'pending'
RETURNING id, prompt_id, tenant, event, target, url, state, attempts, created_at,
          retry_since, next_at, delivered_at, last_status, last_error, body, lease

-- name: prune_webhook_deliveries
WITH gone AS (
    DELETE FROM webhook_deliveries WHERE state != 'pending' AND updated_at < $1 RETURNING 1
)
SELECT count(*) FROM gone
