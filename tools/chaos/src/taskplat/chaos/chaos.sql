-- Read-only queries of `make chaos` over the tasks of one run (config.tag).

-- name: progress
SELECT count(*) FILTER (WHERE status = 'Completed')::int AS completed,
       count(*) FILTER (WHERE status IN ('Completed', 'Dead', 'Canceled'))::int AS finished,
       count(*)::int AS total
FROM tasks
WHERE config ->> 'tag' = %(tag)s;

-- name: not_completed
SELECT task_id::text, status, attempt
FROM tasks
WHERE config ->> 'tag' = %(tag)s AND status <> 'Completed'
ORDER BY task_id;

-- name: completed_twice
-- Tasks with more than one attempt whose completion was accepted.
SELECT a.task_id::text, count(*)::int AS completions
FROM task_attempts AS a
JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.config ->> 'tag' = %(tag)s AND a.outcome = 'Completed'
GROUP BY a.task_id
HAVING count(*) > 1;

-- name: overlapping_attempts
-- Two attempts of one task whose lease periods overlap: the later one started before the earlier
-- one was closed (or the earlier one was never closed).
SELECT a.task_id::text, a.attempt AS earlier, b.attempt AS later
FROM task_attempts AS a
JOIN task_attempts AS b ON b.task_id = a.task_id AND b.attempt > a.attempt
JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.config ->> 'tag' = %(tag)s
  AND b.started_at < coalesce(a.finished_at, 'infinity'::timestamptz);

-- name: completed_attempts
-- The attempt of each task whose completion was accepted.
SELECT a.task_id::text, a.attempt
FROM task_attempts AS a
JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.config ->> 'tag' = %(tag)s AND a.outcome = 'Completed';

-- name: attempt_outcomes
SELECT coalesce(a.outcome, 'open') AS outcome, count(*)::int AS attempts
FROM task_attempts AS a
JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.config ->> 'tag' = %(tag)s
GROUP BY 1
ORDER BY 1;

-- name: task_ids
SELECT task_id::text
FROM tasks
WHERE config ->> 'tag' = %(tag)s;

-- name: attempt_intervals
-- Every attempt of the run's tasks with its task's concurrency key ('' without one): the claim's
-- and the end's own times (database clock), for the limits' check.
SELECT coalesce(t.concurrency_key, '') AS concurrency_key,
       extract(epoch FROM a.started_at)::float8 AS started,
       extract(epoch FROM a.finished_at)::float8 AS finished
FROM task_attempts AS a
JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.config ->> 'tag' = %(tag)s
ORDER BY a.started_at;
