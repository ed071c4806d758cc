-- A platform with history, for the plan checks of test_hot_plans.py (not product code): 30,000
-- finished tasks over the last ten days (95% Completed, 3% Dead after two attempts, 2% Canceled)
-- with their attempts, sent outbox rows (wake-ups and dead letters), outputs and events; and the
-- live rows of a burst: 1,000 Queued tasks with pending wake-ups (ten relay batches: with fewer, the
-- planner never tries to reach them through the primary key, the plan that sank the relay on a
-- million sent rows), 1,000 Running attempts, 500 Scheduled tasks, 500 Failed tasks waiting for
-- their retry.

-- name: fill_history
WITH finished AS (
    INSERT INTO tasks (
        task_id, status, queue, operator, config, inputs, attempt, max_attempts,
        backoff_base_seconds, backoff_max_seconds, lease_token, worker_id, queued_at,
        attempt_outcome, dead_reason, result, last_error, created_at, started_at, finished_at,
        updated_at
    )
    SELECT gen_random_uuid(), s.status, 'q' || (g % 4), 'echo', '{"n": 1}', '[]',
           CASE WHEN s.status = 'Dead' THEN 2 ELSE 1 END, 2, 1, 60, gen_random_uuid(), 'w-1',
           s.at, CASE s.status WHEN 'Dead' THEN 'Failed' ELSE s.status END,
           CASE WHEN s.status = 'Dead' THEN 'AttemptsExhausted' END,
           CASE WHEN s.status = 'Completed' THEN '{"ok": true}'::jsonb END,
           CASE WHEN s.status = 'Dead' THEN 'boom' END,
           s.at, s.at + interval '1 second', s.at + interval '2 seconds',
           s.at + interval '2 seconds'
    FROM generate_series(1, 30000) AS g,
         LATERAL (SELECT CASE WHEN g % 100 < 3 THEN 'Dead'
                              WHEN g % 100 < 5 THEN 'Canceled'
                              ELSE 'Completed' END AS status,
                         now() - interval '10 days' + g * interval '28 seconds' AS at) AS s
    RETURNING task_id, status, queue, attempt, lease_token, started_at, finished_at
),
attempts AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at, finished_at,
                               outcome, completion_digest)
    SELECT f.task_id, a.attempt, 'w-1',
           CASE WHEN a.attempt = f.attempt THEN f.lease_token ELSE gen_random_uuid() END,
           f.started_at, f.finished_at,
           CASE f.status WHEN 'Dead' THEN 'Failed' ELSE f.status END, md5(f.task_id::text)
    FROM finished AS f, generate_series(1, f.attempt) AS a(attempt)
),
wakeups AS (
    INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at, send_attempts,
                        sent_at)
    SELECT 'enqueue_task', f.task_id, f.queue, jsonb_build_object('task_id', f.task_id::text),
           f.started_at, f.started_at, 1, f.started_at
    FROM finished AS f
),
dead_letters AS (
    INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at, send_attempts,
                        sent_at)
    SELECT 'dead_letter', f.task_id, f.queue, jsonb_build_object('task_id', f.task_id::text),
           f.finished_at, f.finished_at, 1, f.finished_at
    FROM finished AS f
    WHERE f.status = 'Dead'
),
outputs AS (
    INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
                              committed_at)
    SELECT f.task_id, 0, f.attempt, gen_random_uuid(), gen_random_uuid(), f.finished_at
    FROM finished AS f
    WHERE f.status = 'Completed'
)
INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor", created_at)
SELECT f.task_id, f.attempt, gen_random_uuid(), gen_random_uuid(), 1, f.finished_at
FROM finished AS f
WHERE f.status = 'Completed'

-- name: fill_live
WITH live AS (
    INSERT INTO tasks (
        task_id, status, queue, operator, max_attempts, backoff_base_seconds,
        backoff_max_seconds, lease_token, lease_expires_at, deadline_at, worker_id, started_at,
        scheduled_for, next_retry_at, expires_at, queued_at, attempt_outcome, created_at,
        updated_at
    )
    SELECT gen_random_uuid(), s.status, 'q' || (g % 4), 'echo', 3, 1, 60,
           CASE WHEN s.status IN ('Running', 'Failed') THEN gen_random_uuid() END,
           CASE WHEN s.status = 'Running' THEN now() + interval '30 seconds' END,
           CASE WHEN s.status = 'Running' THEN now() + interval '1 hour' END,
           CASE WHEN s.status IN ('Running', 'Failed') THEN 'w-2' END,
           CASE WHEN s.status IN ('Running', 'Failed') THEN now() END,
           CASE WHEN s.status = 'Scheduled' THEN now() + interval '1 hour' END,
           CASE WHEN s.status = 'Failed' THEN now() + interval '1 minute' END,
           CASE WHEN g % 10 = 0 AND s.status IN ('Queued', 'Scheduled')
                THEN now() + interval '1 day' END,
           CASE WHEN s.status = 'Queued' THEN now() END,
           CASE WHEN s.status = 'Failed' THEN 'Failed' END,
           now(), now()
    FROM generate_series(1, 3000) AS g,
         LATERAL (SELECT CASE WHEN g % 6 < 2 THEN 'Queued'
                              WHEN g % 6 < 4 THEN 'Running'
                              WHEN g % 6 = 4 THEN 'Scheduled'
                              ELSE 'Failed' END AS status) AS s
    RETURNING task_id, status, queue, lease_token, worker_id, started_at
),
open_attempts AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at, finished_at,
                               outcome)
    SELECT l.task_id, 1, l.worker_id, l.lease_token, l.started_at,
           CASE WHEN l.status = 'Failed' THEN now() END,
           CASE WHEN l.status = 'Failed' THEN 'Failed' END
    FROM live AS l
    WHERE l.status IN ('Running', 'Failed')
)
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at)
SELECT 'enqueue_task', l.task_id, l.queue, jsonb_build_object('task_id', l.task_id::text), now(),
       now()
FROM live AS l
WHERE l.status = 'Queued'

-- name: limit_q1
-- q1 has limits that do not bind: its starts and ends go through the admission and release
-- triggers' statements (migration 0028), planned like the rest.
SELECT name FROM taskplat_set_queue_limits('q1', 100000, 100000, 1000000, 1000000)

-- name: analyze
ANALYZE

-- name: sample_ids
SELECT
    (SELECT task_id FROM tasks WHERE status = 'Queued' ORDER BY task_id LIMIT 1) AS queued,
    (SELECT task_id FROM tasks WHERE status = 'Completed' ORDER BY task_id LIMIT 1) AS completed,
    (SELECT task_id FROM tasks WHERE status = 'Dead' ORDER BY task_id LIMIT 1) AS dead,
    (SELECT max(outbox_id) FROM outbox) AS last_outbox_id

-- name: sample_running
SELECT task_id, attempt, lease_token FROM tasks WHERE status = 'Running' ORDER BY task_id LIMIT 1

-- name: sample_finished_attempt
SELECT task_id, attempt, lease_token FROM tasks WHERE status = 'Completed' ORDER BY task_id LIMIT 1

-- name: hot_table_indexes
SELECT c.relname AS index_name, t.relname AS table_name, i.indpred IS NOT NULL AS partial,
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::int AS pages
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_class AS t ON t.oid = i.indrelid
WHERE t.relname IN ('tasks', 'task_attempts', 'outbox', 'task_outputs', 'task_events')

-- name: last_prepared
SELECT name FROM pg_prepared_statements WHERE NOT from_sql ORDER BY prepare_time DESC LIMIT 1

-- name: force_generic_plan
SET LOCAL plan_cache_mode = force_generic_plan

-- name: load_auto_explain
LOAD 'auto_explain'

-- name: explain_nested
-- Every statement's plan, those run inside functions included, sent to the client as a NOTICE.
SELECT set_config('auto_explain.log_min_duration', '0', true),
       set_config('auto_explain.log_nested_statements', 'on', true),
       set_config('auto_explain.log_format', 'json', true),
       set_config('auto_explain.log_level', 'notice', true)

-- name: plan_cache_mode
SELECT set_config('plan_cache_mode', %(mode)s, true)

-- name: history_counts
SELECT (SELECT count(*) FROM tasks) AS tasks,
       (SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL) AS sent

-- name: hold_statistics
-- The "stale" state: statistics from before the history was loaded must stay so (no autoanalyze).
ALTER TABLE tasks SET (autovacuum_enabled = false);
ALTER TABLE task_attempts SET (autovacuum_enabled = false);
ALTER TABLE outbox SET (autovacuum_enabled = false)
