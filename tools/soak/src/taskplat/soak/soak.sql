-- Read-only queries of `make soak`'s sampler.

-- name: connections
-- Client connections per application_name (each service names its pools), the sampler's own
-- connection and Postgres's own processes (autovacuum workers and the like) left out.
SELECT coalesce(nullif(application_name, ''), 'unnamed') AS application, count(*)::int AS n
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type = 'client backend'
GROUP BY 1
ORDER BY 1;

-- name: tables
SELECT relname AS name,
       n_live_tup::bigint AS live,
       n_dead_tup::bigint AS dead,
       pg_total_relation_size(relid)::bigint AS bytes
FROM pg_stat_user_tables
WHERE schemaname = 'public'
ORDER BY relname;

-- name: task_counts
SELECT count(*) FILTER (WHERE status = 'Queued')::bigint AS queued,
       count(*) FILTER (WHERE status = 'Running')::bigint AS running
FROM tasks;
