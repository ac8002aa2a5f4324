-- comfyfleet job store on PostgreSQL: every statement, by name (see sql_blocks.py).
--
-- A job's columns come in one order everywhere (postgres.py decodes them by position):
-- prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
-- attempt, lane, created_at, started_at, finished_at, error, tenant, owner.
-- A parameter that may be NULL to mean "every tenant" / "no limit" says so in a cast.

-- name: insert_job
-- Pending, or (with a lane) already claimed by it: status, attempt, lane, started_at given.
-- $16 is the gateway: the owner of a claimed job, and the wake-up's payload of a
-- pending one with the job's place in the queue (see parse_work; the notification goes
-- out on commit). A counter value from elsewhere ($17, an integer number) moves the
-- counter past it, in the same statement. With a pending limit ($18), the job goes in
-- only while fewer are pending: $19 is the margin of the shared admission lock, NULL
-- for the exclusive one (see migration_10). With the tenant's cap ($20), the job goes in
-- only while fewer of its tenant's are pending, checked first (see migration_14). No
-- row is inserted (seq NULL) when it is refused; the last column says what refused it:
-- 1 the tenant's cap, 2 the pending limit (CASE checks in order, so the locks are
-- taken in order). A counted job ($21) is numbered here, by the counter's next value
-- (negated for front), not by $2 and $3: the submit needs no round trip of its own for
-- it. The number is the last column (NULL when not counted or refused).
WITH admitted AS (
    SELECT CASE WHEN NOT comfyfleet_admit_tenant($15, $20::bigint) THEN 1
                WHEN $18::bigint IS NULL THEN 0
                WHEN $19::bigint IS NULL THEN
                    CASE WHEN comfyfleet_admit_near($18::bigint) THEN 0 ELSE 2 END
                WHEN comfyfleet_admit_far($18::bigint, $19::bigint) THEN 0
                ELSE 2 END AS refused
), counted AS (
    SELECT CASE WHEN $21::boolean THEN nextval('job_number') END AS number
    FROM admitted WHERE refused = 0
), job AS (
    INSERT INTO jobs (prompt_id, number_json, order_key, front, status, client_id, prompt,
                      extra_data, outputs, node_errors, attempt, lane, created_at, started_at,
                      tenant, owner)
    SELECT $1, COALESCE((CASE WHEN $4 THEN -number ELSE number END)::text, $2::text),
           COALESCE((CASE WHEN $4 THEN 0 ELSE number END)::double precision,
                    $3::double precision),
           $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
           CASE WHEN $5 = 'running' THEN $16 END
    FROM counted
    RETURNING seq, front, order_key
), counter AS (
    SELECT setval('job_number', $17::bigint, false)
    WHERE $17::bigint IS NOT NULL AND EXISTS (SELECT 1 FROM job)
      AND $17::bigint > (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
                         FROM job_number)
), wake AS (
    SELECT pg_notify('comfyfleet_work', comfyfleet_work_payload($16, front, order_key, seq))
    FROM job WHERE $5 = 'pending'
)
SELECT (SELECT seq FROM job), (SELECT count(*) FROM counter), (SELECT count(*) FROM wake),
       (SELECT refused FROM admitted), (SELECT number FROM counted)

-- name: claimable
-- What a claim or a reservation may take: pending and set aside for no lane, in order.
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE status = 'pending' AND lane IS NULL
ORDER BY front DESC, order_key, seq LIMIT $1

-- name: claimable_after
-- The next page: past the job whose dispatch key is ($2, $3, $4), (front DESC, order_key, seq).
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE status = 'pending' AND lane IS NULL
  AND (front < $2 OR (front = $2 AND (order_key, seq) > ($3, $4)))
ORDER BY front DESC, order_key, seq LIMIT $1

-- name: claimable_of
-- A tenant's claimable jobs ($2) in order (fair share: see shares/picking.py).
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE tenant = $2 AND status = 'pending' AND lane IS NULL
ORDER BY front DESC, order_key, seq LIMIT $1

-- name: claimable_of_after
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE tenant = $5 AND status = 'pending' AND lane IS NULL
  AND (front < $2 OR (front = $2 AND (order_key, seq) > ($3, $4)))
ORDER BY front DESC, order_key, seq LIMIT $1

-- name: queue_position
-- Pending jobs ahead of pending job $1 in dispatch order, counted up to $2 (None when it
-- is not pending): the front jobs before a plain one, then those of its own front-ness
-- before it, each a range of jobs_dispatch (an OR of both would walk the whole queue).
WITH me AS (SELECT front, order_key, seq FROM jobs WHERE prompt_id = $1 AND status = 'pending')
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs j, me
         WHERE j.status = 'pending' AND j.front > me.front LIMIT $2) a)
     + (SELECT count(*) FROM (SELECT 1 FROM jobs j, me
         WHERE j.status = 'pending' AND j.front = me.front
           AND (j.order_key, j.seq) < (me.order_key, me.seq) LIMIT $2) b)
FROM me

-- name: queue_position_of
-- As queue_position, among the job's own tenant's pending jobs (jobs_tenant_dispatch).
WITH me AS (SELECT front, order_key, seq, tenant FROM jobs
            WHERE prompt_id = $1 AND status = 'pending')
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs j, me
         WHERE j.tenant = me.tenant AND j.status = 'pending' AND j.front > me.front LIMIT $2) a)
     + (SELECT count(*) FROM (SELECT 1 FROM jobs j, me
         WHERE j.tenant = me.tenant AND j.status = 'pending' AND j.front = me.front
           AND (j.order_key, j.seq) < (me.order_key, me.seq) LIMIT $2) b)
FROM me

-- name: tenant_counts
-- Per tenant: claimable jobs, running ones, and when its oldest claimable one came.
SELECT tenant,
       count(*) FILTER (WHERE status = 'pending' AND lane IS NULL),
       count(*) FILTER (WHERE status = 'running'),
       min(created_at) FILTER (WHERE status = 'pending' AND lane IS NULL)
FROM jobs WHERE status IN ('pending', 'running') GROUP BY tenant

-- name: claim_job
-- Fenced: only while the job is still claimable at the attempt its candidate had ($5).
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = $2, started_at = $3,
                owner = $4
WHERE prompt_id = $1 AND status = 'pending' AND lane IS NULL AND attempt = $5
RETURNING attempt

-- name: lock_tenant_running
-- Claims of one capped tenant's jobs, one at a time across the gateways: each counts
-- its tenant's running jobs after the one before has committed.
SELECT pg_advisory_xact_lock(hashtext('comfyfleet:running:' || $1))

-- name: claim_job_capped
-- As claim_job, while the job's tenant ($6) runs fewer than $7 jobs (its max_running).
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = $2, started_at = $3,
                owner = $4
WHERE prompt_id = $1 AND status = 'pending' AND lane IS NULL AND attempt = $5
  AND (SELECT count(*) FROM jobs AS r WHERE r.status = 'running' AND r.tenant = $6) < $7
RETURNING attempt

-- name: reserve_job
-- A reserved job stays pending, set aside for the lane named in `lane`; fenced as above.
UPDATE jobs SET lane = $2, owner = $3
WHERE prompt_id = $1 AND status = 'pending' AND lane IS NULL AND attempt = $4
RETURNING attempt

-- name: start_reserved
-- $4 is the lane it was reserved for; NULL starts a pending job set aside for no lane.
UPDATE jobs SET status = 'running', attempt = attempt + 1, lane = $2, started_at = $3,
                owner = $5
WHERE prompt_id = $1 AND status = 'pending' AND lane IS NOT DISTINCT FROM $4::text
RETURNING attempt

-- name: unreserve_jobs
WITH given AS (
    UPDATE jobs SET lane = NULL, owner = NULL
    WHERE prompt_id = ANY($1::text[]) AND status = 'pending'
    RETURNING prompt_id
)
SELECT pg_notify('comfyfleet_work', $2) FROM (SELECT count(*) AS n FROM given) g WHERE n > 0

-- name: finish_jobs
-- The ends of many attempts in one statement (a group commit, postgres_parts/batches.py).
-- Per attempt, side by side: prompt_id, attempt, status, error, whether the status makes
-- a history entry, outputs, meta and the event of its webhook deliveries ($1-$8); its
-- messages ($10-$13: place in the batch, seq, type, data) and the files it wrote
-- ($14-$17: place in the batch, filename, subfolder, type) flattened; $9 the time. Each
-- update is fenced on its attempt, and only an attempt it changed gets its history entry
-- (in batch order), messages, files (in the order given) and webhook deliveries (see
-- postgres_parts/webhooks_sql.py). The attempts it changed come back.
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::boolean[],
                         $6::text[], $7::text[], $8::text[])
        WITH ORDINALITY AS b (prompt_id, attempt, status, error, historic, outputs, meta,
                              event, n)
), job AS (
    UPDATE jobs SET status = b.status, finished_at = $9, error = b.error
    FROM batch b
    WHERE jobs.prompt_id = b.prompt_id AND jobs.status = 'running'
      AND jobs.attempt = b.attempt
    RETURNING jobs.prompt_id, jobs.tenant, jobs.extra_data, b.event,
              $9::double precision AS at, b.n, b.attempt, b.status AS ended, b.historic,
              b.outputs, b.meta
), entry AS (
    INSERT INTO history (prompt_id, status, outputs, meta, completed_at)
    SELECT prompt_id, ended, outputs, meta, at FROM job WHERE historic ORDER BY n
), messages AS (
    INSERT INTO events (prompt_id, attempt, seq, type, data)
    SELECT job.prompt_id, job.attempt, e.seq, e.type, e.data
    FROM job JOIN unnest($10::bigint[], $11::bigint[], $12::text[], $13::text[])
        AS e (n, seq, type, data) ON e.n = job.n
), files AS (
    INSERT INTO outputs (prompt_id, filename, subfolder, type)
    SELECT job.prompt_id, f.filename, f.subfolder, f.type
    FROM job JOIN unnest($14::bigint[], $15::text[], $16::text[], $17::text[])
        WITH ORDINALITY AS f (n, filename, subfolder, type, k) ON f.n = job.n
    ORDER BY f.k
), hooks AS ({webhook_deliveries})
SELECT prompt_id, attempt FROM job

-- name: requeue_job
-- The update fenced on the attempt and, when it changed the job and a reason ($3) is
-- given, the reason noted at seq -1 of the attempt (before any of its messages).
WITH job AS (
    UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
    WHERE prompt_id = $1 AND status = 'running' AND attempt = $2
    RETURNING prompt_id, seq, front, order_key
), note AS (
    INSERT INTO events (prompt_id, attempt, seq, type, data)
    SELECT prompt_id, $2, -1, 'requeued', $3 FROM job WHERE $3::text IS NOT NULL
), wake AS (
    SELECT pg_notify('comfyfleet_work', comfyfleet_work_payload($4, front, order_key, seq))
    FROM job
)
SELECT (SELECT count(*) = 1 FROM job), (SELECT count(*) FROM wake)

-- name: attempt_notes_of
SELECT prompt_id, attempt, data FROM events
WHERE prompt_id = ANY($1::text[]) AND type = 'requeued'
ORDER BY prompt_id, attempt

-- name: requeue_lane
-- This gateway's ($2) jobs and orphaned ones ($3: the time now), never another live one's.
UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
WHERE status = 'running' AND starts_with(lane, $1)
  AND (owner = $2 OR owner IS NULL OR NOT EXISTS (
      SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= $3))
RETURNING prompt_id, seq

-- name: cancel_jobs
-- $3: the statuses that may be cancelled (pending, and running unless pending_only); the
-- webhook deliveries of the cancellations with them.
WITH job AS (
    UPDATE jobs SET status = 'cancelled', finished_at = $1
    WHERE prompt_id = ANY($2::text[]) AND status = ANY($3::text[])
    RETURNING prompt_id, tenant, extra_data, 'job.cancelled'::text AS event, $1::double precision AS at
), hooks AS ({webhook_deliveries})
SELECT prompt_id FROM job

-- name: cancel_pending
WITH job AS (
    UPDATE jobs SET status = 'cancelled', finished_at = $1 WHERE status = 'pending'
    RETURNING prompt_id, seq, tenant, extra_data, 'job.cancelled'::text AS event, $1::double precision AS at
), hooks AS ({webhook_deliveries})
SELECT prompt_id, seq FROM job

-- name: delete_history
DELETE FROM history WHERE prompt_id = ANY($1::text[])

-- name: clear_history
DELETE FROM history
WHERE $1::text IS NULL OR prompt_id IN (SELECT prompt_id FROM jobs WHERE tenant = $1)

-- name: delete_jobs
-- Child rows (history, events, outputs) go with the job: ON DELETE CASCADE.
DELETE FROM jobs WHERE prompt_id = ANY($1::text[])

-- name: select_job
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE prompt_id = $1

-- name: select_running
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1)
ORDER BY started_at, seq

-- name: select_pending
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs WHERE status = 'pending' AND ($1::text IS NULL OR tenant = $1)
ORDER BY front DESC, order_key, seq

-- name: count_statuses
SELECT status, count(*) FROM jobs GROUP BY status

-- name: count_active
SELECT count(*) FROM jobs WHERE status IN ('pending', 'running') AND tenant = $1

-- name: owned
SELECT prompt_id FROM jobs WHERE tenant = $1 AND prompt_id = ANY($2::text[])

-- name: jobs_newest_first
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs
WHERE ($1::text[] IS NULL OR status = ANY($1::text[])) AND ($2::text IS NULL OR tenant = $2)
ORDER BY created_at DESC, seq DESC LIMIT $3::bigint OFFSET $4

-- name: jobs_oldest_first
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs
WHERE ($1::text[] IS NULL OR status = ANY($1::text[])) AND ($2::text IS NULL OR tenant = $2)
ORDER BY created_at, seq LIMIT $3::bigint OFFSET $4

-- name: jobs_total
SELECT count(*) FROM jobs
WHERE ($1::text[] IS NULL OR status = ANY($1::text[])) AND ($2::text IS NULL OR tenant = $2)

-- name: history_newest_first
-- The newest $1 entries (of tenant $2, or of all), newest first.
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs,
       j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at,
       j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
WHERE $2::text IS NULL OR j.tenant = $2
ORDER BY h.pos DESC LIMIT $1

-- name: history_oldest_first
-- Skip $2 from the oldest, then at most $1 (NULL: no limit); of tenant $3, or of all.
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs,
       j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at,
       j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
WHERE $3::text IS NULL OR j.tenant = $3
ORDER BY h.pos LIMIT $1::bigint OFFSET $2

-- name: history_one
SELECT j.prompt_id, j.number_json, j.front, j.seq, j.prompt, j.extra_data, j.outputs,
       j.client_id, j.status, j.attempt, j.lane, j.created_at, j.started_at, j.finished_at,
       j.error, j.tenant, j.owner, h.status, h.outputs, h.meta
FROM history h JOIN jobs j ON j.prompt_id = h.prompt_id
WHERE h.prompt_id = $1

-- name: events_of
-- Only the messages of the attempt that finished the job make its history entry.
SELECT e.prompt_id, e.type, e.data FROM events e
JOIN jobs j ON j.prompt_id = e.prompt_id AND j.attempt = e.attempt
WHERE e.prompt_id = ANY($1::text[]) ORDER BY e.prompt_id, e.seq

-- name: outputs_of
SELECT o.prompt_id, o.filename, o.subfolder, o.type, j.tenant
FROM outputs o JOIN jobs j ON j.prompt_id = o.prompt_id
WHERE o.prompt_id = ANY($1::text[]) ORDER BY o.pos

-- name: listed_outputs
-- Which of these files (four arrays: filename, subfolder, type, tenant) a job still lists.
SELECT DISTINCT o.filename, o.subfolder, o.type, j.tenant
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS w (filename, subfolder, type, tenant)
JOIN outputs o ON o.filename = w.filename AND o.subfolder = w.subfolder AND o.type = w.type
JOIN jobs j ON j.prompt_id = o.prompt_id AND j.tenant = w.tenant

-- name: max_counted_number
-- Integer-valued numbers came from the counter (front jobs store it negated); explicit
-- numbers are floats and do not move the counter, as in ComfyUI.
SELECT max(abs(number_json::numeric)) FROM jobs WHERE number_json ~ '^-?[0-9]+$'

-- name: next_number
SELECT nextval('job_number')

-- name: raise_number
-- On open: the counter hands out $1 next unless it is past it already (a database whose
-- jobs were numbered before the sequence kept up with them).
SELECT setval('job_number', $1::bigint, false)
WHERE $1::bigint > (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
                    FROM job_number)

-- name: history_at_rank
-- Retention: the entry at the count limit ...
SELECT pos, completed_at FROM history ORDER BY pos DESC LIMIT 1 OFFSET $1

-- name: history_before
-- ... and what lies before the horizon.
SELECT prompt_id FROM history WHERE pos <= $1 OR completed_at < $2 ORDER BY pos

-- name: unlisted_before
SELECT prompt_id FROM jobs j
WHERE finished_at < $1 AND status IN ('success', 'error', 'interrupted', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM history h WHERE h.prompt_id = j.prompt_id)
ORDER BY finished_at, seq

-- name: select_backends
SELECT spec FROM backends ORDER BY created_at, name

-- name: save_backend
INSERT INTO backends (name, spec, created_at) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec

-- name: delete_backend
DELETE FROM backends WHERE name = $1 RETURNING true

-- The remote-job journal (see postgres_parts/journal_sql.py). Every write about a job is fenced on
-- the job being live and on its owner; a request hash has at most one live job.

-- name: record_remote_job
-- Nothing is written when the request already has a live job (the caller reads that one).
INSERT INTO remote_jobs (id, request_hash, provider, kind, prompt_id, node_id, slot, state,
                         remote_id, resume, error, attempts, created_at, updated_at,
                         finished_at, owner, tenant, model, cost)
VALUES ($1, $2, $3, $4, $5, $6, NULL, 'submitting', NULL, $7, NULL, 0, $8, $8, NULL, $9,
        $10, $11, $12)
ON CONFLICT (request_hash) WHERE state IN ('submitting', 'running') DO NOTHING
RETURNING id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner, result, result_type

-- name: remote_job_exists
SELECT true FROM remote_jobs WHERE id = $1

-- name: remote_live_for_request
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner, NULL::bytea, NULL::text
FROM remote_jobs WHERE request_hash = $1 AND state IN ('submitting', 'running')

-- name: remote_job_submitted
UPDATE remote_jobs SET state = 'running', remote_id = $2, resume = $3, updated_at = $4
WHERE id = $1 AND state IN ('submitting', 'running') AND owner = $5
RETURNING true

-- name: finish_remote_job
WITH done AS (
    UPDATE remote_jobs
    SET state = $2, result = $3, result_type = $4, error = $5,
        attempts = coalesce($6, attempts), updated_at = $7, finished_at = $7
    WHERE id = $1 AND state IN ('submitting', 'running') AND owner = $8
    RETURNING id
), waited AS (
    DELETE FROM remote_job_waiters w USING done WHERE w.job_id = done.id
)
SELECT true FROM done

-- name: adopt_remote_job
-- The job is the caller's already, or its owner holds no lease ($3: the time now).
UPDATE remote_jobs SET owner = $2, updated_at = $3
WHERE id = $1 AND state IN ('submitting', 'running')
  AND (owner IS NULL OR owner = $2 OR NOT EXISTS (
      SELECT 1 FROM gateways g WHERE g.id = remote_jobs.owner AND g.lease_until >= $3))
RETURNING id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner, NULL::bytea, NULL::text

-- name: wait_on_remote_job
INSERT INTO remote_job_waiters (job_id, gateway) VALUES ($1, $2) ON CONFLICT DO NOTHING

-- name: stop_waiting_on_remote_job
DELETE FROM remote_job_waiters WHERE job_id = $1 AND gateway = $2

-- name: own_live_remote_job
SELECT true FROM remote_jobs
WHERE id = $1 AND state IN ('submitting', 'running') AND owner = $2
FOR UPDATE

-- name: live_waiter
-- A live gateway other than the owner ($2) that waits on the job, the latest seen first.
SELECT w.gateway FROM remote_job_waiters w JOIN gateways g ON g.id = w.gateway
WHERE w.job_id = $1 AND w.gateway <> $2 AND g.lease_until >= $3
ORDER BY g.seen_at DESC, g.id LIMIT 1

-- name: hand_over_remote_job
WITH handed AS (
    UPDATE remote_jobs SET owner = $3, updated_at = $4
    WHERE id = $1 AND state IN ('submitting', 'running') AND owner = $2
    RETURNING id
)
DELETE FROM remote_job_waiters w USING handed WHERE w.job_id = handed.id AND w.gateway = $3

-- name: assign_remote_slots
UPDATE remote_jobs r SET slot = s.slot
FROM unnest($1::text[], $2::bigint[]) AS s (id, slot)
WHERE r.id = s.id

-- name: remote_job
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner, result, result_type
FROM remote_jobs WHERE id = $1

-- name: remote_reusable
-- For each of some request hashes, its newest succeeded job (with its result), else its
-- newest job: one round trip for a batch of requests, also when they are new (the usual
-- case). A hash with no job has no row.
SELECT DISTINCT ON (request_hash)
       id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner,
       CASE WHEN state = 'succeeded' THEN result END,
       CASE WHEN state = 'succeeded' THEN result_type END
FROM remote_jobs WHERE request_hash = ANY($1::text[])
ORDER BY request_hash, state = 'succeeded' DESC, created_at DESC, pos DESC

-- name: remote_live
-- This gateway's ($1) live jobs and orphans ($2: the time now), not another live one's.
SELECT id, request_hash, provider, kind, prompt_id, node_id, slot, state, remote_id,
       resume, error, attempts, created_at, updated_at, finished_at, owner, NULL::bytea, NULL::text
FROM remote_jobs
WHERE state IN ('submitting', 'running')
  AND (owner IS NULL OR owner = $1 OR NOT EXISTS (
      SELECT 1 FROM gateways g WHERE g.id = remote_jobs.owner AND g.lease_until >= $2))
ORDER BY created_at, pos

-- name: paid_lock
-- A tenant's budget lock (see migration_16), held until the transaction ends.
SELECT comfyfleet_paid_lock($1)

-- name: known_requests
-- Of some request hashes, those a new job would not be sent for: a succeeded job kept
-- its result (reused), or a live job runs it (waited on).
SELECT DISTINCT request_hash FROM remote_jobs
WHERE request_hash = ANY($1::text[])
  AND (state IN ('submitting', 'running') OR (state = 'succeeded' AND result IS NOT NULL))

-- name: paid_by_tenant
-- A tenant's paid jobs recorded since a time, and their cost: every job that may have
-- been billed (see comfyfleet/spend/budget.py). Not counted: a job that failed with no
-- remote id and no ambiguous submit (the provider refused it, or never got it).
-- Prompts run on backends count by their holds (paid_job_holds).
SELECT sum(n)::bigint, sum(c) FROM (
    SELECT count(*) AS n, coalesce(sum(cost), 0) AS c FROM remote_jobs
    WHERE tenant = $1 AND created_at >= $2
      AND NOT (state = 'failed' AND remote_id IS NULL
               AND coalesce(error::jsonb ->> 'class', '') <> 'AmbiguousSubmit')
    UNION ALL
    SELECT coalesce(sum(paid_jobs), 0), coalesce(sum(spend), 0) FROM paid_job_holds
    WHERE tenant = $1 AND created_at >= $2) AS counted

-- name: paid_by_prompt
-- One prompt's paid jobs and their cost, counted as paid_by_tenant counts.
SELECT sum(n)::bigint, sum(c) FROM (
    SELECT count(*) AS n, coalesce(sum(cost), 0) AS c FROM remote_jobs
    WHERE prompt_id = $1
      AND NOT (state = 'failed' AND remote_id IS NULL
               AND coalesce(error::jsonb ->> 'class', '') <> 'AmbiguousSubmit')
    UNION ALL
    SELECT coalesce(sum(paid_jobs), 0), coalesce(sum(spend), 0) FROM paid_job_holds
    WHERE prompt_id = $1) AS counted

-- name: hold_of
-- A prompt's hold on one backend.
SELECT paid_jobs, spend, settled, created_at FROM paid_job_holds
WHERE prompt_id = $1 AND backend = $2

-- name: hold
-- A prompt's hold on one backend, set (a new grant replaces the last one's).
INSERT INTO paid_job_holds (prompt_id, backend, tenant, paid_jobs, spend, settled, created_at)
VALUES ($1, $2, $3, $4, $5, FALSE, $6)
ON CONFLICT (prompt_id, backend) DO UPDATE SET
    tenant = excluded.tenant, paid_jobs = excluded.paid_jobs, spend = excluded.spend,
    settled = FALSE, created_at = excluded.created_at

-- name: settle
-- What the prompt spent on the backend, which the hold now counts: never more than the
-- hold (the backend refuses jobs past its allowance; one that says otherwise is wrong).
UPDATE paid_job_holds SET paid_jobs = LEAST($1, paid_jobs), spend = LEAST($2, spend),
    settled = TRUE
WHERE prompt_id = $3 AND backend = $4

-- name: prune_holds
DELETE FROM paid_job_holds WHERE created_at < $1

-- name: prune_remote_jobs
WITH gone AS (
    DELETE FROM remote_jobs WHERE finished_at < $1 AND state NOT IN ('submitting', 'running')
    RETURNING id
), waited AS (
    DELETE FROM remote_job_waiters w USING gone WHERE w.job_id = gone.id
)
SELECT count(*) FROM gone

-- name: notify_work
SELECT pg_notify('comfyfleet_work', $1)

-- Gateways and leases (see base.GatewayLeases): a job is orphaned once its owner's
-- lease has run out ($n: the time now), or when it has no owner.

-- name: gateway_holder
SELECT id, instance, host, pid, url, started_at, seen_at, lease_until
FROM gateways WHERE id = $1 FOR UPDATE

-- name: upsert_gateway
INSERT INTO gateways (id, instance, host, pid, url, started_at, seen_at, lease_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, host = excluded.host,
    pid = excluded.pid, url = excluded.url, started_at = excluded.started_at,
    seen_at = excluded.seen_at, lease_until = excluded.lease_until

-- name: heartbeat
UPDATE gateways SET seen_at = $3, lease_until = $4 WHERE id = $1 AND instance = $2

-- name: leave
DELETE FROM gateways WHERE id = $1 AND instance = $2

-- name: live_gateways
SELECT g.id, g.instance, g.host, g.pid, g.url, g.started_at, g.seen_at, g.lease_until,
       (SELECT count(*) FROM jobs j WHERE j.status = 'running' AND j.owner = g.id)
FROM gateways g WHERE g.lease_until >= $1 ORDER BY g.id

-- name: orphaned
SELECT prompt_id, number_json, front, seq, prompt, extra_data, outputs, client_id, status,
       attempt, lane, created_at, started_at, finished_at, error, tenant, owner
FROM jobs
WHERE (status = 'running' OR (status = 'pending' AND lane IS NOT NULL))
  AND (owner IS NULL OR NOT EXISTS (
      SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= $1))
ORDER BY started_at, seq

-- name: ping
SELECT 1

-- name: reserve_file_counter
-- Output name counters every gateway shares (see sqlite_parts/file_counters_sql.py).
INSERT INTO file_counters (key, next) VALUES ($1, $2::bigint + $3::bigint)
ON CONFLICT (key) DO UPDATE SET next = greatest(file_counters.next, $2::bigint) + $3::bigint
RETURNING next - $3::bigint

-- name: requeue_orphaned
WITH job AS (
    UPDATE jobs SET status = 'pending', lane = NULL, started_at = NULL, owner = NULL
    WHERE prompt_id = $1 AND attempt = $2 AND status = 'running' AND (owner IS NULL OR
        NOT EXISTS (SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= $3))
    RETURNING prompt_id, seq, front, order_key
), wake AS (
    SELECT pg_notify('comfyfleet_work', comfyfleet_work_payload($4, front, order_key, seq))
    FROM job
)
SELECT (SELECT count(*) = 1 FROM job), (SELECT count(*) FROM wake)

-- name: adopt
-- The note goes with the attempt left behind, as a re-queue's reason does.
WITH job AS (
    UPDATE jobs SET owner = $4, attempt = attempt + 1
    WHERE prompt_id = $1 AND attempt = $2 AND status = 'running' AND (owner IS NULL OR
        NOT EXISTS (SELECT 1 FROM gateways g WHERE g.id = jobs.owner AND g.lease_until >= $3))
    RETURNING prompt_id
), note AS (
    INSERT INTO events (prompt_id, attempt, seq, type, data)
    SELECT prompt_id, $2, -1, 'requeued', $5 FROM job
)
SELECT count(*) = 1 FROM job
-- name: idempotency_claim
-- Record a key for its job, in the job's transaction. A key older than the window ($7)
-- is free again: its row is taken over; a fresh one is left alone and returns no row.
INSERT INTO idempotency_keys (tenant, key, request_hash, prompt_id, answer, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant, key) DO UPDATE SET
    request_hash = excluded.request_hash, prompt_id = excluded.prompt_id,
    answer = excluded.answer, created_at = excluded.created_at
WHERE idempotency_keys.created_at <= $7
RETURNING true

-- name: idempotency_first
SELECT key, request_hash, answer, created_at FROM idempotency_keys
WHERE tenant = $1 AND key = $2 AND created_at > $3

-- name: idempotency_forget_expired
-- Each keyed submit forgets a few expired keys (rows another transaction holds are left
-- to the next one), so the table holds about one window of keys.
DELETE FROM idempotency_keys WHERE (tenant, key) IN (
    SELECT tenant, key FROM idempotency_keys WHERE created_at <= $1 LIMIT 16
    FOR UPDATE SKIP LOCKED
)

-- name: append_prompt_events
-- The events side by side ($1 prompt ids, $2 types, $3 data, $6 frames: NULL for a JSON
-- frame), inserted in the order given, so their ids grow in that order. In the same transaction, one notification per
-- prompt on comfyfleet_events, delivered once the rows are committed: `$5 DIGEST ID`
-- ($5: the appending store instance; DIGEST: event_wakeups.client_digest of the job's
-- client, `-` for none; ID: the prompt id, empty past 1,000 characters).
WITH inserted AS (
    INSERT INTO event_log (prompt_id, type, data, frame, at)
    SELECT e.prompt_id, e.type, e.data, e.frame, $4
    FROM unnest($1::text[], $2::text[], $3::text[], $6::bytea[])
        WITH ORDINALITY AS e (prompt_id, type, data, frame, n)
    ORDER BY e.n
    RETURNING id
), woken AS (
    SELECT pg_notify('comfyfleet_events', $5::text || ' '
        || coalesce(left(md5(length(j.tenant) || ':' || j.tenant || j.client_id), 16), '-')
        || ' ' || CASE WHEN length(p.prompt_id) <= 1000 THEN p.prompt_id ELSE '' END)
    FROM (SELECT DISTINCT prompt_id FROM unnest($1::text[]) AS u (prompt_id)) p
    LEFT JOIN jobs j ON j.prompt_id = p.prompt_id
)
SELECT i.id FROM inserted i, (SELECT count(*) FROM woken) w

-- name: prompts_appended_since
-- Each prompt with an event appended at or after $1 (at most $2), with its client's
-- digest as append_prompt_events notifies it (NULL: none).
SELECT p.prompt_id, left(md5(length(j.tenant) || ':' || j.tenant || j.client_id), 16)
FROM (SELECT DISTINCT prompt_id FROM event_log WHERE at >= $1 LIMIT $2) p
LEFT JOIN jobs j ON j.prompt_id = p.prompt_id

-- name: prompt_events
-- At most $3 events after id $2, ending with the one whose frame brings the page's frame
-- bytes to $4 or more.
SELECT id, type, data, at, frame FROM (
    SELECT l.*, coalesce(sum(octet_length(l.frame)) OVER (
        ORDER BY l.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM (SELECT id, type, data, at, frame FROM event_log
          WHERE prompt_id = $1 AND id > $2 ORDER BY id LIMIT $3) l
) page
WHERE before < $4
ORDER BY id

-- name: prune_prompt_events
-- Prompts with an event older than the cutoff (found by time, so each prune reads only
-- what aged since the last), whose newest event is older too and whose job is over.
WITH old AS (
    SELECT DISTINCT prompt_id FROM event_log WHERE at < $1
), ended AS (
    SELECT prompt_id FROM old
    WHERE (SELECT l.at FROM event_log l WHERE l.prompt_id = old.prompt_id
           ORDER BY l.id DESC LIMIT 1) < $1
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.prompt_id = old.prompt_id
                      AND j.status IN ('pending', 'running'))
), gone AS (
    DELETE FROM event_log WHERE prompt_id IN (SELECT prompt_id FROM ended) RETURNING 1
)
SELECT count(*) FROM gone

-- Fleet keys (see postgres_parts/fleet_keys_sql.py): the first candidate stored wins.

-- name: fleet_key_keep_first
INSERT INTO fleet_keys (name, key, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING

-- name: fleet_key
SELECT key FROM fleet_keys WHERE name = $1

-- == webhook outbox ===========================================================
-- The webhook outbox on PostgreSQL: its statements, by name (see sql_blocks.py).
-- A delivery's columns come in one order (postgres_parts/webhooks_sql.py decodes them by position):
-- id, prompt_id, tenant, event, target, url, state, attempts, created_at, retry_since,
-- next_at, delivered_at, last_status, last_error, body, lease.

-- name: webhook_deliveries
-- Not a statement: the CTE body that the job-ending statements (finish_jobs, cancel_jobs,
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

-- == backend owners ===========================================================
-- Backend ownership on PostgreSQL (see sqlite_parts/backend_owners_sql.py): named blocks the
-- store runs for the `BackendOwners` verbs. A backend is owned while its owner's
-- lease (the gateways table) holds ($n: the time now).

-- name: lock_backend_claims
-- Claims run one at a time across the fleet: each reads, then takes, in one transaction.
SELECT pg_advisory_xact_lock(7208405713518)

-- name: lease_holds
SELECT EXISTS (SELECT 1 FROM gateways WHERE id = $1 AND instance = $2 AND lease_until >= $3)

-- name: backend_owner_rows
-- The rows of the backends offered ($2), with their owner if live, and as recorded.
SELECT o.backend, o.client_id,
       CASE WHEN EXISTS (SELECT 1 FROM gateways g
                         WHERE g.id = o.owner AND g.lease_until >= $1) THEN o.owner END,
       o.since, o.owner
FROM backend_owners o WHERE o.backend = ANY($2::text[])

-- name: insert_backend_owner
INSERT INTO backend_owners (backend, client_id, owner, since) VALUES ($1, $2, $3, $4)

-- name: take_backend
UPDATE backend_owners SET owner = $2, since = $3 WHERE backend = $1

-- name: release_backends
UPDATE backend_owners SET owner = NULL WHERE owner = $1 AND backend = ANY($2::text[])

-- name: release_all_backends
UPDATE backend_owners SET owner = NULL WHERE owner = $1

-- name: forget_backend_owner
DELETE FROM backend_owners WHERE backend = $1

-- name: backend_owners
SELECT o.backend, o.client_id,
       CASE WHEN EXISTS (SELECT 1 FROM gateways g
                         WHERE g.id = o.owner AND g.lease_until >= $1) THEN o.owner END,
       o.since
FROM backend_owners o ORDER BY o.backend

-- == Comfy API v2 assets =======================================================

-- name: asset_insert
INSERT INTO assets (tenant, id, hash, size, content_type, file_path, blob, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)

-- name: asset_select
SELECT id, tenant, hash, size, content_type, file_path, blob, created_at
FROM assets WHERE tenant = $1 AND id = $2

-- name: asset_by_hash
SELECT id, tenant, hash, size, content_type, file_path, blob, created_at
FROM assets WHERE tenant = $1 AND hash = $2 ORDER BY created_at, id LIMIT 1

-- name: asset_delete
DELETE FROM assets WHERE tenant = $1 AND id = $2 RETURNING 1


-- == published nodes ==========================================================
-- The nodes of lanes only one gateway reaches: see seams/published_nodes.py.

-- name: node_set_keep
-- Kept fresh: a set published again is not taken by a tidy-up under way (see node_sets_unused).
INSERT INTO node_sets (digest, node_set, created_at) VALUES ($1, $2, $3)
ON CONFLICT (digest) DO UPDATE SET created_at = excluded.created_at

-- name: published_lane_upsert
INSERT INTO published_lanes (lane, gateway, digest, published_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (lane) DO UPDATE SET gateway = excluded.gateway, digest = excluded.digest,
    published_at = excluded.published_at

-- name: published_lane_delete
DELETE FROM published_lanes WHERE lane = $1 AND gateway = $2

-- name: published_lanes_of_the_dead
-- Lanes of gateways gone (no lease for a minute): nobody reaches them any more.
DELETE FROM published_lanes WHERE gateway NOT IN (
    SELECT id FROM gateways WHERE lease_until >= $1 - 60)

-- name: node_sets_unused
-- Only sets a minute old: one a gateway is publishing now is fresh (node_set_keep).
DELETE FROM node_sets
WHERE created_at < $1 - 60 AND digest NOT IN (SELECT digest FROM published_lanes)

-- name: published_lanes_elsewhere
SELECT p.lane, p.digest FROM published_lanes p JOIN gateways g ON g.id = p.gateway
WHERE p.gateway <> $1 AND g.lease_until >= $2 ORDER BY p.lane

-- name: node_set_select
SELECT node_set FROM node_sets WHERE digest = $1
