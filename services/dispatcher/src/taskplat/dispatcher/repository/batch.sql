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

-- name: insert_tasks
-- A bulk create: every task of the batch (its idempotency key already taken: skipped), and the
-- `enqueue_task` outbox row of each inserted task that is Queued, in one statement; held, due
-- %(polled_wakeup_delay_seconds)s later, for a queue whose workers wait on the dispatcher
-- (`insert_task` in tasks.sql says why).
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
    RETURNING task_id, status, queue, operator, attempt
),
outboxed AS (  -- taskplat_enqueue_wakeups (migration 0020): the Queued tasks' only
    SELECT count(*) AS written
    FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT i.task_id FROM inserted AS i), n.now,
                                     %(trace_context)s::jsonb,
                                     %(polled_wakeup_delay_seconds)s::double precision)
)
SELECT i.* FROM inserted AS i, outboxed  -- outboxed: one row, read so that it runs

-- name: notify_queues
-- The relay, and the claims waiting on the dispatcher for these queues' tasks (they hear it too).
SELECT pg_notify('taskplat_outbox', q) FROM unnest(%(queues)s::text[]) AS q

-- name: find_tasks_by_idempotency_keys
SELECT task_id, idempotency_key FROM tasks WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: get_tasks
SELECT * FROM task_details WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: complete_many
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
c AS (
    SELECT * FROM unnest(%(task_ids)s::uuid[], %(attempts)s::integer[], %(lease_tokens)s::uuid[],
        %(statuses)s::text[], %(results)s::jsonb[], %(errors)s::text[], %(retry_afters)s::float8[],
        %(jitters)s::float8[], %(digests)s::text[], %(events)s::jsonb[], %(outputs)s::jsonb[],
        %(retryables)s::boolean[])
        AS c(task_id, attempt, lease_token, status, result, error, retry_after, jitter, digest,
             events, outputs, retryable)
),
locked AS MATERIALIZED (
    SELECT t.task_id FROM tasks AS t JOIN c USING (task_id)
    WHERE t.status = 'Running' AND t.attempt = c.attempt AND t.lease_token = c.lease_token
    ORDER BY t.task_id
    FOR UPDATE OF t
),
done AS (
    UPDATE tasks AS t
    SET status = taskplat_ended_status(t, c.status, c.retryable),
        attempt_outcome = c.status,
        result = CASE WHEN c.status = 'Completed' THEN c.result ELSE t.result END,
        last_error = CASE WHEN c.status = 'Completed' THEN t.last_error ELSE c.error END,
        dead_reason = taskplat_dead_reason(t, c.status, c.retryable),
        processing_attempts = t.processing_attempts + (c.status = 'Drained')::int,
        next_retry_at = taskplat_retry_at(t, c.status, c.retryable, n.now, c.retry_after,
            c.jitter),
        finished_at = CASE WHEN taskplat_ended_status(t, c.status, c.retryable) = 'Failed'
            THEN NULL ELSE n.now END,
        lease_expires_at = NULL,
        updated_at = n.now
    FROM n, c, locked AS l
    WHERE t.task_id = c.task_id AND l.task_id = t.task_id AND t.status = 'Running'
      AND t.attempt = c.attempt AND t.lease_token = c.lease_token
    RETURNING t.task_id, t.status, t.queue, t.operator, t.attempt, t.worker_id, t.started_at,
        t.dead_reason, t.next_retry_at, n.now AS ended_at, c.status AS reported, c.error,
        c.digest, c.lease_token, c.events, c.outputs
),
closed AS (
    UPDATE task_attempts AS a
    SET finished_at = d.ended_at, outcome = d.reported, completion_digest = d.digest,
        error = CASE WHEN d.reported IN ('Failed', 'Drained') THEN d.error END
    FROM done AS d
    WHERE a.task_id = d.task_id AND a.attempt = d.attempt AND a.lease_token = d.lease_token
),
events AS (
    INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
        partition_key, range_start, range_end, created_at)
    SELECT d.task_id, d.attempt, e.dataset_uuid, e.dataset_version, e.cursor, e.partition_key,
        e.start, e.end, d.ended_at
    FROM done AS d, jsonb_to_recordset(d.events) AS e(
        dataset_uuid uuid, dataset_version uuid, "cursor" bigint, partition_key text,
        "start" bigint, "end" bigint)
    ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
),
outputs AS (
    INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
        location, "cursor", row_count, committed_at)
    SELECT d.task_id, x.output_index, d.attempt, x.dataset_uuid, x.dataset_version, x.location,
        x.cursor, x.row_count, d.ended_at
    FROM done AS d, jsonb_to_recordset(d.outputs) AS x(
        output_index integer, dataset_uuid uuid, dataset_version uuid, location text,
        "cursor" bigint, row_count bigint)
    WHERE d.status = 'Completed'
    ON CONFLICT (task_id, output_index) DO UPDATE
    SET (attempt, dataset_uuid, dataset_version, location, "cursor", row_count, committed_at) =
        (EXCLUDED.attempt, EXCLUDED.dataset_uuid, EXCLUDED.dataset_version, EXCLUDED.location,
         EXCLUDED."cursor", EXCLUDED.row_count, EXCLUDED.committed_at)
)
SELECT task_id, status, queue, operator, attempt, worker_id, started_at, dead_reason,
    next_retry_at, ended_at
FROM done
