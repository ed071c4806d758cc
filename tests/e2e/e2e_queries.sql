-- Read-only inspection queries of the end-to-end tests (not product code).

-- name: status_counts
SELECT status, count(*)::int AS tasks
FROM tasks
WHERE task_id = ANY(%(ids)s::uuid[])
GROUP BY status;

-- name: completion_counts
-- One row per task: how many of its attempts completed, and how many it had.
SELECT t.task_id, t.status, t.attempt,
       count(a.attempt) FILTER (WHERE a.outcome = 'Completed')::int AS completions,
       count(a.attempt)::int AS attempts
FROM tasks AS t
LEFT JOIN task_attempts AS a ON a.task_id = t.task_id
WHERE t.task_id = ANY(%(ids)s::uuid[])
GROUP BY t.task_id, t.status, t.attempt;

-- name: task_events
SELECT attempt, dataset_uuid::text, dataset_version::text, "cursor"
FROM task_events
WHERE task_id = %(task_id)s::uuid
ORDER BY "cursor";

-- name: outbox_rows
SELECT kind, queue, sent_at, created_at
FROM outbox
WHERE task_id = %(task_id)s::uuid
ORDER BY outbox_id;

-- name: attempts
SELECT attempt, worker_id, lease_token::text, started_at, finished_at, outcome, error
FROM task_attempts
WHERE task_id = %(task_id)s::uuid
ORDER BY attempt;

-- name: results
SELECT task_id::text, config, result
FROM tasks
WHERE task_id = ANY(%(ids)s::uuid[]);

-- name: tag_progress
-- Progress of the tasks whose config carries this tag.
SELECT count(*) FILTER (WHERE status = 'Completed')::int AS completed,
       count(*) FILTER (WHERE status IN ('Completed', 'Dead', 'Canceled'))::int AS finished,
       count(*)::int AS total
FROM tasks
WHERE config ->> 'tag' = %(tag)s;

-- name: wakeup_and_start
-- A task's wake-up (held or not, when it was due, whether the relay sent it) and its first
-- attempt's start.
SELECT o.held, o.available_at, o.sent_at, a.started_at
FROM outbox AS o
JOIN task_attempts AS a ON a.task_id = o.task_id AND a.attempt = 1
WHERE o.task_id = %(task_id)s::uuid AND o.kind = 'enqueue_task'
