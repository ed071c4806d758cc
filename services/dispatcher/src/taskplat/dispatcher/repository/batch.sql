-- The dispatcher's batch statements: several tasks in one statement.
--
-- Invariants: the claims are the SQL functions of migration 0020 (taskplat_claim: the named tasks
-- still claimable once locked, locked in task_id order so concurrent batch claims of overlapping
-- tasks wait for each other instead of deadlocking; taskplat_claim_next: free Queued rows of one
-- queue, SKIP LOCKED, oldest first, never a task of a `runtime: lambda` job); every claim records
-- its attempt in the same statement. Time is coalesce(%(now)s::timestamptz, now()).

-- name: claim_tasks
SELECT * FROM taskplat_claim(%(task_ids)s::uuid[], %(worker_id)s,
                             %(lease_seconds)s::double precision,
                             %(default_timeout_seconds)s::integer, %(now)s::timestamptz)

-- name: claim_next
SELECT * FROM taskplat_claim_next(%(queue)s::text, %(max)s::integer, %(worker_id)s::text,
                                  %(lease_seconds)s::double precision,
                                  %(default_timeout_seconds)s::integer, %(now)s::timestamptz)

-- name: read_fences
SELECT t.task_id, t.status, t.attempt, t.lease_token, t.attempt_outcome,
       EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused) AS paused
FROM tasks AS t
WHERE t.task_id = ANY(%(task_ids)s::uuid[])

-- name: find_tasks_by_idempotency_keys
SELECT task_id, idempotency_key FROM tasks WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: get_tasks
SELECT * FROM task_details WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: complete_many
-- The completion (taskplat_end_attempts, migration 0020) of several attempts of distinct tasks.
SELECT task_id, status, queue, operator, attempt, worker_id, started_at, dead_reason,
       next_retry_at, ended_at
FROM taskplat_end_attempts(
    %(task_ids)s::uuid[], %(attempts)s::integer[], %(lease_tokens)s::uuid[], %(statuses)s::text[],
    %(retryables)s::boolean[], %(results)s::jsonb[], %(errors)s::text[],
    %(retry_afters)s::double precision[], %(jitters)s::double precision[], %(digests)s::text[],
    %(events)s::jsonb[], %(outputs)s::jsonb[], %(now)s::timestamptz)
