-- Test setup and inspection for the dispatcher's tests (not product code).
--
-- name: lock_other_tasks
-- Every task row but one, locked until the caller's transaction ends: the reaper's and the
-- scheduler's SKIP LOCKED selections then see only that one.
SELECT task_id FROM tasks WHERE task_id <> %(task_id)s::uuid FOR UPDATE

-- name: reap_timeouts
-- The reaper's timeouts (taskplat_reap_timeouts, migration 0020), jitter 0.
SELECT * FROM taskplat_reap_timeouts(%(now)s::timestamptz, 0, 10, array_fill(0.0::float8, ARRAY[10]))

-- name: queue_due
-- The scheduler's promotions and retries (taskplat_queue_due, migration 0020).
SELECT * FROM taskplat_queue_due(%(now)s::timestamptz, 10, 10)

-- name: row_counts
SELECT (SELECT count(*) FROM tasks) AS tasks,
       (SELECT count(*) FROM task_attempts) AS task_attempts,
       (SELECT count(*) FROM task_outputs) AS task_outputs,
       (SELECT count(*) FROM task_events) AS task_events,
       (SELECT count(*) FROM outbox) AS outbox

-- name: task_row
SELECT * FROM tasks WHERE task_id = %(task_id)s

-- name: attempt_rows
SELECT * FROM task_attempts WHERE task_id = %(task_id)s ORDER BY attempt

-- name: outbox_rows
SELECT * FROM outbox WHERE task_id = %(task_id)s ORDER BY outbox_id

-- name: event_rows
SELECT * FROM task_events WHERE task_id = %(task_id)s ORDER BY event_id

-- name: output_rows
SELECT * FROM task_outputs WHERE task_id = %(task_id)s ORDER BY output_index

-- name: task_xmin
-- The transaction that last wrote the task row (xmin), to prove two rows share one transaction.
SELECT xmin::text AS xmin FROM tasks WHERE task_id = %(task_id)s

-- name: pin_rows
SELECT dataset_uuid::text AS dataset_uuid, dataset_version::text AS dataset_version
FROM task_pins
WHERE task_id = %(task_id)s
ORDER BY 1

-- name: outbox_xmins
SELECT xmin::text AS xmin FROM outbox WHERE task_id = %(task_id)s ORDER BY outbox_id
