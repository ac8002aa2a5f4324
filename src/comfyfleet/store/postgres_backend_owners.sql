-- Backend ownership on PostgreSQL (see sqlite_backend_owners.py): named blocks the
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
