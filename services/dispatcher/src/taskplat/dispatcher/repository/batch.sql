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
-- that).
SELECT t.task_id
FROM tasks AS t
WHERE t.status = 'Queued'
  AND t.queue = %(queue)s
  AND (t.expires_at IS NULL OR t.expires_at > coalesce(%(now)s::timestamptz, now()))
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
-- Why a batch claim took nothing of each task: as read_claim_fence (tasks.sql).
SELECT t.task_id, t.status, t.attempt, t.lease_token, t.attempt_outcome,
       EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused) AS paused,
       taskplat_untrusted(t.job, t.operator, %(untrusted_operators)s::text[]) AS untrusted
FROM tasks AS t
WHERE t.task_id = ANY(%(task_ids)s::uuid[])

-- name: insert_tasks
-- A bulk create: every task of the batch (its idempotency key already taken: skipped), the pins
-- of each inserted task of a job (to the versions its inputs name, resolved by the caller), and the
-- `enqueue_task` outbox row of each inserted task that is Queued, in one statement; held, due
-- %(polled_wakeup_delay_seconds)s later, for a queue whose workers wait on the dispatcher
-- (`insert_task` in tasks.sql says why). Each inserted row comes back with the columns of its
-- task view (`task_details` less its attempts and outputs, none yet for a new task), so the
-- answer needs no second read.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
inserted AS (
    INSERT INTO tasks (
        task_id, status, queue, operator, job, config, inputs, max_attempts,
        max_processing_attempts, on_exhausted, backoff_base_seconds, backoff_max_seconds,
        timeout_seconds, scheduled_for, expires_at, idempotency_key, queued_at, created_at,
        updated_at, trace_context
    )
    SELECT
        i.task_id,
        CASE WHEN i.scheduled_for > n.now THEN 'Scheduled' ELSE 'Queued' END,
        i.queue, i.operator, i.job, i.config, i.inputs, i.max_attempts,
        i.max_processing_attempts, i.on_exhausted,
        i.backoff_base_seconds, i.backoff_max_seconds, i.timeout_seconds,
        i.scheduled_for, i.expires_at, i.idempotency_key,
        CASE WHEN i.scheduled_for > n.now THEN NULL ELSE n.now END,
        n.now, n.now, %(trace_context)s
    FROM n,
         unnest(%(task_ids)s::uuid[], %(queues)s::text[], %(operators)s::text[],
                %(jobs)s::jsonb[], %(configs)s::jsonb[], %(inputs)s::jsonb[],
                %(max_attempts)s::integer[], %(max_processing_attempts)s::integer[],
                %(on_exhausteds)s::text[],
                %(backoff_base_seconds)s::double precision[],
                %(backoff_max_seconds)s::double precision[], %(timeout_seconds)s::integer[],
                %(scheduled_for)s::timestamptz[], %(expires_at)s::timestamptz[],
                %(idempotency_keys)s::text[])
             WITH ORDINALITY
             AS i(task_id, queue, operator, job, config, inputs, max_attempts,
                  max_processing_attempts, on_exhausted, backoff_base_seconds,
                  backoff_max_seconds, timeout_seconds, scheduled_for, expires_at,
                  idempotency_key, position)
    ORDER BY i.position
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
),
pins AS (
    INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
    SELECT p.dataset_uuid, p.dataset_version, i.task_id
    FROM inserted AS i,
         taskplat_input_pins(CASE WHEN i.job IS NOT NULL THEN i.inputs END) AS p
),
outboxed AS (  -- taskplat_enqueue_wakeups (migration 0020): the Queued tasks' only
    SELECT count(*) AS written
    FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT i.task_id FROM inserted AS i), n.now,
                                     %(trace_context)s::jsonb,
                                     %(polled_wakeup_delay_seconds)s::double precision)
)
SELECT i.task_id, i.status, i.queue, i.operator, i.attempt, i.max_attempts,
       i.attempt - i.replay_offset - i.processing_attempts AS counted_attempts,
       i.processing_attempts, i.max_processing_attempts, i.on_exhausted, i.job, i.config,
       i.inputs, i.result, i.last_error, i.dead_reason, i.cancel_reason, i.scheduled_for,
       i.next_retry_at, i.expires_at, i.timeout_seconds, i.backoff_base_seconds,
       i.backoff_max_seconds, i.idempotency_key, i.worker_id, i.created_at, i.started_at,
       i.finished_at
FROM inserted AS i, outboxed  -- outboxed: one row, read so that it runs

-- name: notify_queues
-- The relay, and the claims waiting on the dispatcher for these queues' tasks (they hear it too).
SELECT pg_notify('taskplat_outbox', q) FROM unnest(%(queues)s::text[]) AS q

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
