-- Task state transitions of the dispatcher.
--
-- Every transition is one guarded UPDATE naming the status (and, for a worker call, the attempt and
-- lease token) it expects; zero rows means the guard failed and the caller classifies why from a
-- fresh read. Time is coalesce(%(now)s::timestamptz, now()): the database clock unless a test passes
-- a fake now.

-- name: insert_tasks
-- Creates tasks (taskplat_create_tasks, migration 0023: the rows, their pins, the wake-ups of the
-- Queued ones and their NOTIFY), given one array per field of taskplat_new_task, in order. An
-- element whose idempotency key is already taken creates nothing and returns no row. While a
-- queue's workers wait on a dispatcher for its tasks (`queues.polled_until` ahead, migration
-- 0016), the wake-up is written held, due %(polled_wakeup_delay_seconds)s later, and the NOTIFY
-- goes to those waiting claims (`taskplat_queued`) instead of the relay; with %(notify_held)s
-- false (one of this dispatcher's own waiting claims of the queue waits: the caller wakes it
-- after the commit) a held wake-up NOTIFYs no one. Each row is the new task as `task_details`
-- shows it (no attempt and no output yet, migration 0008), so the create answers without reading
-- it back, and `held` says whether its wake-up was held.
SELECT (c.task).*,
       (c.task).attempt - (c.task).replay_offset - (c.task).processing_attempts
           AS counted_attempts,
       '[]'::json AS attempts, '[]'::json AS outputs, c.held
FROM taskplat_create_tasks(
    ARRAY(SELECT ROW(i.task_id, i.queue, i.operator, i.job, i.config, i.inputs, i.max_attempts,
                     i.max_processing_attempts, i.on_exhausted, i.backoff_base_seconds,
                     i.backoff_max_seconds, i.timeout_seconds, i.scheduled_for, i.expires_at,
                     i.idempotency_key, i.priority, i.concurrency_key)::taskplat_new_task
          FROM unnest(%(task_ids)s::uuid[], %(queues)s::text[], %(operators)s::text[],
                      %(jobs)s::jsonb[], %(configs)s::jsonb[], %(inputs)s::jsonb[],
                      %(max_attempts)s::integer[], %(max_processing_attempts)s::integer[],
                      %(on_exhausteds)s::text[], %(backoff_base_seconds)s::double precision[],
                      %(backoff_max_seconds)s::double precision[],
                      %(timeout_seconds)s::integer[], %(scheduled_for)s::timestamptz[],
                      %(expires_at)s::timestamptz[], %(idempotency_keys)s::text[],
                      %(priorities)s::integer[], %(concurrency_keys)s::text[])
                   WITH ORDINALITY
                   AS i(task_id, queue, operator, job, config, inputs, max_attempts,
                        max_processing_attempts, on_exhausted, backoff_base_seconds,
                        backoff_max_seconds, timeout_seconds, scheduled_for, expires_at,
                        idempotency_key, priority, concurrency_key, position)
          ORDER BY i.position),
    %(now)s::timestamptz, %(trace_context)s::jsonb,
    %(polled_wakeup_delay_seconds)s::double precision, %(notify_held)s::boolean) AS c

-- name: get_task_by_idempotency_key
-- The task holding the key, as `get_task` reads it (the key's unique index).
SELECT * FROM task_details WHERE idempotency_key = %(idempotency_key)s

-- name: insert_outbox_dead_letter
-- The dead-letter record of a task that is Dead (taskplat_dead_letter, migration 0020).
SELECT count(*) AS written
FROM taskplat_dead_letter(ARRAY[%(task_id)s::uuid], coalesce(%(now)s::timestamptz, now()),
                          %(trace_context)s::jsonb)

-- name: notify_outbox
SELECT pg_notify('taskplat_outbox', %(queue)s)

-- name: get_task
SELECT * FROM task_details WHERE task_id = %(task_id)s

-- name: list_tasks
SELECT *
FROM task_details AS t
WHERE (%(status)s::text IS NULL OR t.status = %(status)s)
  AND (%(queue)s::text IS NULL OR t.queue = %(queue)s)
  AND (%(operator)s::text IS NULL OR t.operator = %(operator)s)
  AND (%(dag)s::text IS NULL OR t.job ->> 'dag_name' = %(dag)s)
  AND (%(job)s::text IS NULL OR t.job ->> 'name' = %(job)s)
  AND (%(since)s::timestamptz IS NULL OR t.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR t.created_at < %(until)s::timestamptz)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (t.created_at, t.task_id) < (%(after_created_at)s::timestamptz, %(after_task_id)s::uuid))
ORDER BY t.created_at DESC, t.task_id DESC
LIMIT %(limit)s

-- name: read_fence
-- `paused`: the task's queue is paused (a claim of a Queued task then answers Paused).
SELECT t.task_id, t.status, t.attempt, t.lease_token, t.attempt_outcome,
       EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused) AS paused
FROM tasks AS t
WHERE t.task_id = %(task_id)s

-- name: read_fence_for_update
SELECT t.task_id, t.status, t.attempt, t.lease_token, t.attempt_outcome,
       a.completion_digest
FROM tasks AS t
LEFT JOIN task_attempts AS a ON a.task_id = t.task_id AND a.attempt = t.attempt
WHERE t.task_id = %(task_id)s
FOR UPDATE OF t

-- name: claim_task
-- The claim (taskplat_claim, migration 0020) of one task, with the caller's lease token.
-- Without capability keys (%(capability_keys)s false) an untrusted task is not claimable.
SELECT * FROM taskplat_claim(ARRAY[%(task_id)s::uuid], %(worker_id)s,
                             %(lease_seconds)s::double precision,
                             %(default_timeout_seconds)s::integer,
                             %(now)s::timestamptz, %(lease_token)s::uuid,
                             p_capability_keys => %(capability_keys)s::boolean,
                             p_untrusted_operators => %(untrusted_operators)s::text[])

-- name: fetch_task
SELECT task_id, status, attempt, job, operator, queue, config, inputs, timeout_seconds,
       deadline_at, taskplat_job_outputs(job) AS outputs,
       taskplat_job_trust(job) AS trust, taskplat_task_steps(task_id, attempt) AS steps
FROM tasks
WHERE task_id = %(task_id)s

-- name: heartbeat
-- The lease extension of the named Running attempt (taskplat_heartbeat, migration 0022).
SELECT * FROM taskplat_heartbeat(%(task_id)s::uuid, %(attempt)s::integer, %(lease_token)s::uuid,
                                 %(lease_seconds)s::double precision, %(now)s::timestamptz)

-- name: insert_events
-- Stores events only while the named attempt is Running and holds the lease (when a token is
-- given); the guard row is share-locked so a cancel or completion waits for this commit.
WITH guard AS MATERIALIZED (  -- taskplat_share_fence, migration 0023
    SELECT f.task_id
    FROM taskplat_share_fence(%(task_id)s::uuid, %(attempt)s::integer, %(lease_token)s::uuid) AS f
),
inserted AS (
    INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
                             partition_key, range_start, range_end, created_at)
    SELECT g.task_id, %(attempt)s, e.dataset_uuid, e.dataset_version, e.cursor,
           e.partition_key, e.range_start, e.range_end,
           coalesce(%(now)s::timestamptz, now())
    FROM guard AS g,
         unnest(%(dataset_uuids)s::uuid[], %(dataset_versions)s::uuid[], %(cursors)s::bigint[],
                %(partition_keys)s::text[], %(range_starts)s::bigint[], %(range_ends)s::bigint[])
             AS e(dataset_uuid, dataset_version, cursor, partition_key, range_start, range_end)
    ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM guard) AS guarded, (SELECT count(*) FROM inserted) AS inserted

-- name: complete_running
-- See tasks.complete_running: the completion (taskplat_end_attempts, migration 0020) of one
-- attempt and, for a task that became Dead, its dead-letter record (taskplat_dead_letter) and the
-- relay's NOTIFY. %(ended)s: how the attempt ended (Completed, Failed, Drained).
WITH done AS MATERIALIZED (
    SELECT e.*
    FROM taskplat_end_attempts(
        ARRAY[%(task_id)s::uuid], ARRAY[%(attempt)s::integer], ARRAY[%(lease_token)s::uuid],
        ARRAY[%(ended)s::text], ARRAY[%(retryable)s::boolean], ARRAY[%(result)s::jsonb],
        ARRAY[%(error_message)s::text], ARRAY[%(retry_after_seconds)s::double precision],
        ARRAY[%(jitter)s::double precision], ARRAY[%(completion_digest)s::text],
        ARRAY[%(events)s::jsonb], ARRAY[%(outputs)s::jsonb], %(now)s::timestamptz) AS e
),
dead_letter AS (
    SELECT l.queue
    FROM done AS d, taskplat_dead_letter(ARRAY[d.task_id], d.ended_at, %(trace_context)s::jsonb)
         AS l(queue)
    WHERE d.status = 'Dead'
),
notified AS (SELECT pg_notify('taskplat_outbox', queue) FROM dead_letter)
SELECT d.*, (SELECT count(*) FROM notified) AS notified FROM done AS d

-- name: complete_late
-- A late success of the current attempt after its lease or deadline ran out
-- (taskplat_complete_late, migration 0023): accepted while no newer attempt started and the task
-- was not canceled; its attempt record closed as Completed with the digest, its events and
-- outputs stored; a task that had died of the timeout gets a `resolved` dead-letter record.
-- The caller holds the row lock (read_fence_for_update).
SELECT * FROM taskplat_complete_late(%(task_id)s::uuid, %(attempt)s::integer,
                                     %(lease_token)s::uuid, %(result)s::jsonb,
                                     %(trace_context)s::jsonb, %(now)s::timestamptz,
                                     %(completion_digest)s::text, %(events)s::jsonb,
                                     %(outputs)s::jsonb)

-- name: cancel_task
-- The cancel by request (taskplat_cancel_tasks, migration 0023) of one live task: its row and
-- open attempt record; no row when the task is not live.
SELECT * FROM taskplat_cancel_tasks(ARRAY[%(task_id)s::uuid], 'Requested', %(now)s::timestamptz)

-- name: replay_pins
-- The pin check of a replay (migration 0017): the tasks among %(task_ids)s pinned to a dataset
-- version that is no longer current, locked; with %(repin)s they are re-pinned and none returned.
SELECT taskplat_replay_pins(%(task_ids)s::uuid[], %(repin)s) AS task_id

-- name: replay_task
-- A replay: a new attempt with a fresh attempt budget, Queued at once, with its wake-up
-- (taskplat_replay, migration 0021: the bulk replay calls it too).
SELECT *
FROM taskplat_replay(ARRAY[%(task_id)s::uuid], coalesce(%(now)s::timestamptz, now()),
                     %(trace_context)s::jsonb)

-- name: ping
SELECT 1 AS ok

-- name: record_step
-- A step's result of the task of the named attempt, only while that attempt is Running and holds
-- the lease (when a token is given): stored when %(record)s and none is stored yet (the first
-- recorded result wins), and the stored one returned. The guard row is share-locked like events.
WITH guard AS MATERIALIZED (  -- taskplat_share_fence, migration 0023
    SELECT f.task_id
    FROM taskplat_share_fence(%(task_id)s::uuid, %(attempt)s::integer, %(lease_token)s::uuid) AS f
),
inserted AS (
    INSERT INTO task_steps (task_id, step, attempt, result, created_at)
    SELECT g.task_id, %(step)s, %(attempt)s, %(result)s, coalesce(%(now)s::timestamptz, now())
    FROM guard AS g
    WHERE %(record)s
    ON CONFLICT (task_id, step) DO NOTHING
    RETURNING attempt, result
),
stored AS (
    SELECT s.attempt, s.result
    FROM task_steps AS s
    JOIN guard AS g ON g.task_id = s.task_id
    WHERE s.step = %(step)s
)
SELECT (SELECT count(*) FROM guard) AS guarded,
       (SELECT count(*) FROM inserted) AS inserted,
       coalesce((SELECT attempt FROM inserted), (SELECT attempt FROM stored)) AS recorded_attempt,
       coalesce((SELECT result FROM inserted), (SELECT result FROM stored)) AS result
