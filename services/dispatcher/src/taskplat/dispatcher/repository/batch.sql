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
                             %(default_timeout_seconds)s::integer, %(now)s::timestamptz,
                             p_capability_keys => %(capability_keys)s::boolean,
                             p_untrusted_operators => %(untrusted_operators)s::text[])

-- name: claim_next
SELECT * FROM taskplat_claim_next(%(queue)s::text, %(max)s::integer, %(worker_id)s::text,
                                  %(lease_seconds)s::double precision,
                                  %(default_timeout_seconds)s::integer, %(now)s::timestamptz,
                                  %(capability_keys)s::boolean, %(untrusted_operators)s::text[])

-- name: refused_untrusted
-- Up to %(max)s Queued tasks of the queue a claim-next left because they run untrusted
-- (taskplat_untrusted, migration 0024) and this dispatcher has no capability keys; never a
-- `runtime: lambda` job's task (claim-next never takes those), none of a paused queue (left for
-- that): the tasks a claimer holding capability keys could start (taskplat_claimable).
SELECT t.task_id
FROM tasks AS t
WHERE t.status = 'Queued'
  AND t.queue = %(queue)s
  AND taskplat_claimable(t, coalesce(%(now)s::timestamptz, now()), true, '{}')
  AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = %(queue)s AND q.paused)
  AND taskplat_untrusted(t.job, t.operator, %(untrusted_operators)s::text[])
  AND (t.job IS NULL
       OR NOT EXISTS (SELECT 1 FROM jobs AS j
                      WHERE j.dag_name = t.job ->> 'dag_name'
                        AND j.name = t.job ->> 'name'
                        AND j.runtime = 'lambda'))
ORDER BY t.queued_at
LIMIT %(max)s

-- name: read_fences
-- Why a claim (of one task or a batch) took nothing of each task: `paused`, its queue is paused;
-- `untrusted`, it runs untrusted (taskplat_untrusted, migration 0024); `limited`, a limit of its
-- queue holds it back, with `retry_after_ms` (taskplat_limit_refusal, migration 0028).
SELECT t.task_id, t.status, t.attempt, t.lease_token, t.attempt_outcome,
       EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused) AS paused,
       taskplat_untrusted(t.job, t.operator, %(untrusted_operators)s::text[]) AS untrusted,
       t.queue, r.reason AS limited, r.retry_after_ms,
       EXISTS (SELECT 1 FROM queues AS q
               WHERE q.name = t.queue
                 AND (q.concurrency_limit IS NOT NULL OR q.key_concurrency_limit IS NOT NULL
                      OR q.rate_per_second IS NOT NULL)) AS has_limits,
       coalesce(t.expires_at <= now(), false) AS expired
FROM tasks AS t
LEFT JOIN LATERAL taskplat_limit_refusal(t.queue, t.concurrency_key, %(now)s::timestamptz) AS r
       ON t.status = 'Queued'
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
