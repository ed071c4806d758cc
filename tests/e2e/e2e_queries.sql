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
