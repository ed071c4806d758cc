-- Cron schedules of jobs: one run per job and tick.
--
-- due_schedules locks the jobs whose next tick has come (FOR UPDATE SKIP LOCKED: a replica skips
-- the jobs another one is starting); the caller starts the run with a key per job and tick and moves
-- schedule_next_at past now with advance_schedule, guarded by the tick it read, all in one
-- transaction. Time is coalesce(%(now)s::timestamptz, now()).

-- name: due_schedules
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT j.dag_name, j.name, j.schedule, j.schedule_next_at, j.queue, j.operator, n.now
FROM jobs AS j, n
WHERE j.schedule_next_at <= n.now
ORDER BY j.schedule_next_at
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED

-- name: start_scheduled_run
-- A run of a job on its tick (taskplat_start_job_run, migration 0023: created as any task is).
SELECT taskplat_start_job_run(%(dag_name)s, %(job_name)s, '[]'::jsonb, NULL, %(idempotency_key)s,
                              %(now)s, NULL,
                              p_hold_seconds => %(hold_seconds)s) AS task_id

-- name: advance_schedule
UPDATE jobs
SET schedule_next_at = %(next_at)s
WHERE dag_name = %(dag_name)s AND name = %(job_name)s AND schedule_next_at = %(due_at)s
