-- Keys, the audit log and the workers (migration 0018_keys_audit_workers).

-- name: find_key
SELECT name, scopes FROM api_keys WHERE key_hash = %(key_hash)s

-- name: insert_key
INSERT INTO api_keys (name, key_hash, scopes, created_at, created_by)
VALUES (%(name)s, %(key_hash)s, %(scopes)s::text[], coalesce(%(now)s::timestamptz, now()),
        %(created_by)s)
ON CONFLICT (name) DO NOTHING
RETURNING name, scopes, created_at, created_by

-- name: list_keys
SELECT name, scopes, created_at, created_by FROM api_keys ORDER BY name

-- name: delete_key
DELETE FROM api_keys WHERE name = %(name)s RETURNING name

-- name: insert_audit
INSERT INTO audit_log (at, key_name, action, target, outcome, detail)
VALUES (coalesce(%(now)s::timestamptz, now()), %(key_name)s, %(action)s, %(target)s,
        %(outcome)s, %(detail)s)

-- name: list_audit
-- Newest first; `before_id` pages (the cursor is the last audit_id of the previous page).
SELECT audit_id, at, key_name, action, target, outcome, detail
FROM audit_log
WHERE (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR at < %(until)s::timestamptz)
  AND (%(key_name)s::text IS NULL OR key_name = %(key_name)s::text)
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(target)s::text IS NULL OR target = %(target)s::text)
  AND (%(before_id)s::bigint IS NULL OR audit_id < %(before_id)s::bigint)
ORDER BY audit_id DESC
LIMIT %(limit)s

-- name: upsert_worker
INSERT INTO workers (worker_id, queues, slots, version, running, first_seen, last_seen)
VALUES (%(worker_id)s, %(queues)s::text[], %(slots)s, %(version)s, %(running)s::uuid[],
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, slots = excluded.slots, version = excluded.version,
    running = excluded.running, last_seen = excluded.last_seen

-- name: list_workers
-- The workers seen within `seen_within_seconds`, the latest first.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT w.worker_id, w.queues, w.slots, w.version, w.running, w.first_seen, w.last_seen,
       greatest(extract(epoch FROM n.now - w.last_seen), 0)::float8 AS seconds_since_seen
FROM workers AS w, n
WHERE w.last_seen >= n.now - make_interval(secs => %(seen_within_seconds)s)
ORDER BY w.last_seen DESC, w.worker_id
LIMIT %(limit)s

-- name: prune_workers
DELETE FROM workers
WHERE last_seen < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_seconds)s)

-- name: register_queue
INSERT INTO queues (name, created_at, updated_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: workers_per_queue
-- The workers that reported within `seen_within_seconds`, counted per queue they serve.
SELECT q AS queue, count(*) AS workers
FROM workers AS w, unnest(w.queues) AS q
WHERE w.last_seen >= coalesce(%(now)s::timestamptz, now())
                     - make_interval(secs => %(seen_within_seconds)s)
GROUP BY q
