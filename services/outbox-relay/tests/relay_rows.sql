-- Test setup and inspection rows of the relay's tests (not product code): a Queued task and a
-- Dead task, as states; their outbox rows come from the functions every service writes them with
-- (taskplat_enqueue_wakeups, taskplat_dead_letter: migration 0020), never from a copy.

-- name: insert_queued_tasks
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
new_tasks AS (
    INSERT INTO tasks (
        task_id, status, queue, operator, max_attempts, backoff_base_seconds,
        backoff_max_seconds, queued_at, created_at, updated_at
    )
    SELECT u.task_id, 'Queued', %(queue)s, 'echo', 3, 1, 60, n.now, n.now, n.now
    FROM unnest(%(task_ids)s::uuid[]) AS u(task_id), n
    RETURNING task_id
)
SELECT count(*) AS written
FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT t.task_id FROM new_tasks AS t), n.now,
                                 %(trace_context)s::jsonb)

-- name: insert_dead_task
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO tasks (
    task_id, status, queue, operator, attempt, max_attempts, backoff_base_seconds,
    backoff_max_seconds, attempt_outcome, dead_reason, last_error, created_at, started_at,
    finished_at, updated_at
)
SELECT %(task_id)s, 'Dead', %(queue)s, 'echo', 3, 3, 1, 60, 'Failed', 'AttemptsExhausted',
       %(last_error)s, n.now, n.now, n.now, n.now
FROM n

-- name: insert_dead_letter
SELECT count(*) AS written
FROM taskplat_dead_letter(ARRAY[%(task_id)s::uuid], coalesce(%(now)s::timestamptz, now()),
                          %(trace_context)s::jsonb)

-- name: insert_raw_outbox
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at)
SELECT %(kind)s, %(task_id)s, %(queue)s, %(payload)s, n.now, n.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS n
RETURNING outbox_id

-- name: notify_outbox
SELECT pg_notify('taskplat_outbox', %(queue)s)

-- name: outbox_rows
SELECT outbox_id, kind, task_id, queue, send_attempts, last_error, available_at, sent_at
FROM outbox
ORDER BY outbox_id

-- name: listening_backends
SELECT count(*) AS listeners
FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE 'LISTEN %%'

-- name: terminate_relay_backends
SELECT count(pg_terminate_backend(pid)) AS terminated
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = %(application_name)s
  AND pid <> pg_backend_pid()

-- name: queue_row
SELECT name, sqs_missing_since, sqs_next_probe_at, sqs_probes FROM queues WHERE name = %(name)s

-- name: outbox_held
SELECT outbox_id, held FROM outbox ORDER BY outbox_id
