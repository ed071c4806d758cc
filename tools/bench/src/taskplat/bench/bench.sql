-- Queries of `make bench` (taskplat.bench) on the bench stack's private database.
-- All read-only except `prefill` and `vacuum` (W4's setup). Task ids come as one uuid[].

-- name: server
SELECT current_setting('server_version') AS version,
       current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes;

-- name: unfinished
-- Tasks not yet terminal (the wrappers are idle when this is 0 and nothing is due).
SELECT count(*)::int AS n FROM tasks WHERE status NOT IN ('Completed', 'Dead', 'Canceled');

-- name: finished_count
SELECT count(*)::int AS n
FROM tasks
WHERE task_id = ANY(%(ids)s::uuid[]) AND status IN ('Completed', 'Dead', 'Canceled');

-- name: finished_since
-- Progress only: terminal tasks created since a client time (uses tasks_created_idx).
SELECT count(*)::int AS n
FROM tasks
WHERE created_at >= to_timestamp(%(since)s::float8)
  AND status IN ('Completed', 'Dead', 'Canceled');

-- name: operator_times
-- The operators' own timestamps (result payload of the bench operators).
SELECT min((result ->> 'started')::float8) AS first_started,
       max((result ->> 'finished')::float8) AS last_finished,
       count(result ->> 'finished')::int AS with_times
FROM tasks
WHERE task_id = ANY(%(ids)s::uuid[]);

-- name: latency_stages
-- W2's breakdown, per task: created (dispatcher, database clock), first wake-up sent to SQS
-- (relay; a skipped one sent nothing), first attempt claimed (dispatcher), operator started (the
-- operator's clock).
SELECT t.task_id::text AS task_id,
       extract(epoch FROM t.created_at)::float8 AS created,
       extract(epoch FROM o.sent_at)::float8 AS sent,
       extract(epoch FROM a.started_at)::float8 AS claimed,
       (t.result ->> 'started')::float8 AS started
FROM tasks AS t
LEFT JOIN task_attempts AS a ON a.task_id = t.task_id AND a.attempt = 1
LEFT JOIN (
    SELECT task_id, min(sent_at) AS sent_at
    FROM outbox
    WHERE task_id = ANY(%(ids)s::uuid[]) AND kind = 'enqueue_task' AND NOT skipped
    GROUP BY task_id
) AS o ON o.task_id = t.task_id
WHERE t.task_id = ANY(%(ids)s::uuid[]);

-- name: exactly_once
-- Each task: Completed, on its first attempt, with one attempt row whose outcome is Completed.
SELECT count(*)::int AS tasks,
       count(*) FILTER (WHERE t.status = 'Completed')::int AS completed,
       count(*) FILTER (WHERE t.attempt = 1)::int AS first_attempt,
       coalesce(sum(a.attempts), 0)::int AS attempts,
       coalesce(sum(a.completed), 0)::int AS completed_attempts
FROM tasks AS t
CROSS JOIN LATERAL (
    SELECT count(*) AS attempts, count(*) FILTER (WHERE outcome = 'Completed') AS completed
    FROM task_attempts
    WHERE task_attempts.task_id = t.task_id
) AS a
WHERE t.task_id = ANY(%(ids)s::uuid[]);

-- name: task_state
SELECT status, attempt, worker_id, result FROM tasks WHERE task_id = %(task_id)s::uuid;

-- name: attempts_of
SELECT attempt, worker_id, extract(epoch FROM started_at)::float8 AS started,
       extract(epoch FROM finished_at)::float8 AS finished, outcome
FROM task_attempts
WHERE task_id = %(task_id)s::uuid
ORDER BY attempt;

-- name: prefill
-- W4: `rows` finished tasks of queue 'default', each with its one Completed attempt, finished
-- between 3 days and ~1 day ago (inside the reaper's default 7-day retention, so none is pruned).
-- Their ids are UUIDv7 of their creation time, as the dispatcher makes them: a random uuid whose
-- first 48 bits are the Unix time in milliseconds and whose version nibble is 7.
WITH inserted AS (
    INSERT INTO tasks (
        task_id, status, queue, operator, config, inputs, attempt, max_attempts,
        backoff_base_seconds, backoff_max_seconds, lease_token, worker_id, queued_at,
        attempt_outcome, result, created_at, started_at, finished_at, updated_at)
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
                  substring(int8send((extract(epoch FROM c.created) * 1000)::bigint) FROM 3)
                  FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
           'Completed', 'default', 'noop', '{}'::jsonb, '[]'::jsonb, 1, 3,
           1.0, 300.0, gen_random_uuid(), 'bench-prefill', c.created, 'Completed',
           '{"prefill": true}'::jsonb, c.created, c.created + interval '10 ms',
           c.created + interval '20 ms', c.created + interval '20 ms'
    FROM generate_series(1, %(rows)s::int) AS g
    CROSS JOIN LATERAL (
        SELECT now() - interval '3 days' + g * (interval '2 days' / %(rows)s::int) AS created
    ) AS c
    RETURNING task_id, lease_token, worker_id, started_at, finished_at
)
INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at, finished_at,
                           outcome)
SELECT task_id, 1, worker_id, lease_token, started_at, finished_at, 'Completed'
FROM inserted;

-- name: analyze
-- After the warm-up: statistics of a database that has seen tasks (a fresh one has none, and a
-- plan made while `tasks` was empty would be kept by prepared statements).
ANALYZE;

-- name: vacuum
VACUUM (ANALYZE) tasks, task_attempts;

-- name: table_rows
SELECT (SELECT count(*) FROM tasks)::bigint AS tasks,
       (SELECT count(*) FROM task_attempts)::bigint AS attempts,
       pg_total_relation_size('tasks') + pg_total_relation_size('task_attempts') AS bytes;

-- name: wakeups
-- Wake-ups written for a run's tasks: one each when created, more from the scheduler's
-- re-publications (and retries, none in the no-op workloads).
SELECT count(*)::int AS n
FROM outbox
WHERE task_id = ANY(%(ids)s::uuid[]) AND kind = 'enqueue_task';

-- name: w5_routed
-- W5: each event of the buffered dataset (its cursor = the table's high mark at that write) and
-- when its first downstream task was created.
SELECT e."cursor", min(r.created_at) AS routed_at
FROM task_events AS e
JOIN event_routes AS r ON r.event_id = e.event_id
WHERE e.dataset_uuid = %(dataset_uuid)s
GROUP BY e."cursor"
ORDER BY e."cursor"

-- name: queue_pending_wakeups
-- Wake-ups of a queue not yet sent (missing_queue: a held queue's wait in the outbox).
SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL AND queue = %(queue)s

-- name: queue_wakeups_written
-- Wake-ups ever written for a queue (missing_queue: none may be added while it is held).
SELECT count(*) AS n FROM outbox WHERE kind = 'enqueue_task' AND queue = %(queue)s

-- name: attempt_intervals
-- W7: each attempt of a run's tasks, with its task's concurrency key ('' without one): started
-- and finished (the claim's and the end's own times, database clock), oldest start first.
SELECT coalesce(t.concurrency_key, '') AS concurrency_key,
       extract(epoch FROM a.started_at)::float8 AS started,
       extract(epoch FROM a.finished_at)::float8 AS finished
FROM task_attempts AS a
JOIN tasks AS t ON t.task_id = a.task_id
WHERE a.task_id = ANY(%(ids)s::uuid[])
ORDER BY a.started_at

-- name: block_io
-- Shared-buffer block accesses per table and index of the database, cumulative since the
-- server started: `hit` found in shared buffers, `read` brought in from outside them (the OS's
-- page cache or the disk). A backend reports its counts at the end of a transaction, at most
-- once a second, so a snapshot is taken after the backends settled.
SELECT 'table ' || relname AS relation,
       coalesce(heap_blks_hit, 0) + coalesce(toast_blks_hit, 0) AS hit,
       coalesce(heap_blks_read, 0) + coalesce(toast_blks_read, 0) AS read
FROM pg_statio_user_tables
UNION ALL
SELECT 'index ' || indexrelname, coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0)
FROM pg_statio_user_indexes;
