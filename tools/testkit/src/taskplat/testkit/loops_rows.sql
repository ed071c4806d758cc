-- Test setup and inspection for the scheduler's and the reaper's tests (not product code).

-- name: insert_task
INSERT INTO tasks (
    task_id, status, queue, operator, attempt, replay_offset, max_attempts,
    backoff_base_seconds, backoff_max_seconds, timeout_seconds, lease_token, lease_expires_at,
    deadline_at, worker_id, scheduled_for, next_retry_at, expires_at, queued_at, attempt_outcome,
    dead_reason, last_error, created_at, started_at, finished_at, updated_at,
    processing_attempts, max_processing_attempts, on_exhausted
) VALUES (
    %(task_id)s, %(status)s, %(queue)s, %(operator)s, %(attempt)s, %(replay_offset)s,
    %(max_attempts)s, %(backoff_base_seconds)s, %(backoff_max_seconds)s, %(timeout_seconds)s,
    %(lease_token)s, %(lease_expires_at)s, %(deadline_at)s, %(worker_id)s, %(scheduled_for)s,
    %(next_retry_at)s, %(expires_at)s, %(queued_at)s, %(attempt_outcome)s, %(dead_reason)s,
    %(last_error)s, %(created_at)s, %(started_at)s, %(finished_at)s, %(created_at)s,
    %(processing_attempts)s, %(max_processing_attempts)s, %(on_exhausted)s
)

-- name: insert_attempt
INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at, finished_at,
                           outcome)
VALUES (%(task_id)s, %(attempt)s, %(worker_id)s, %(lease_token)s, %(started_at)s,
        %(finished_at)s, %(outcome)s)

-- name: insert_output
INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
                          committed_at)
VALUES (%(task_id)s, 0, %(attempt)s, gen_random_uuid(), gen_random_uuid(), %(now)s)

-- name: insert_event
INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor", created_at)
VALUES (%(task_id)s, %(attempt)s, gen_random_uuid(), gen_random_uuid(), 1, %(now)s)

-- name: insert_outbox
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at, sent_at)
VALUES ('enqueue_task', %(task_id)s, 'default', jsonb_build_object('task_id', %(task_id)s::text),
        %(created_at)s, %(created_at)s, %(sent_at)s)
RETURNING outbox_id

-- name: finish_running_task
-- The holder's completion (taskplat_end_attempts, migration 0020) at %(finished_at)s.
SELECT e.task_id
FROM tasks AS t
CROSS JOIN LATERAL taskplat_end_attempts(
    ARRAY[t.task_id], ARRAY[t.attempt], ARRAY[t.lease_token], ARRAY['Completed'], ARRAY[true],
    ARRAY[NULL::jsonb], ARRAY[NULL::text], ARRAY[NULL::double precision], ARRAY[0.5],
    ARRAY['digest'], ARRAY['[]'::jsonb], ARRAY['[]'::jsonb], %(finished_at)s::timestamptz) AS e
WHERE t.task_id = %(task_id)s AND t.status = 'Running'

-- name: complete_running
-- A holder's completion of its attempt as the dispatcher reports it (taskplat_end_attempts,
-- migration 0020), with the dead-letter record of a task it killed (taskplat_dead_letter).
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
)
SELECT d.*, (SELECT count(*) FROM dead_letter) AS dead_lettered FROM done AS d

-- name: heartbeat
-- A holder's heartbeat (taskplat_heartbeat, migration 0022).
SELECT * FROM taskplat_heartbeat(%(task_id)s::uuid, %(attempt)s::integer, %(lease_token)s::uuid,
                                 %(lease_seconds)s::double precision, %(now)s::timestamptz)

-- name: lock_task
-- The row lock a late success takes before it decides (the dispatcher reads its fence so).
SELECT task_id FROM tasks WHERE task_id = %(task_id)s FOR UPDATE

-- name: complete_late
-- A late success of a timed-out attempt (taskplat_complete_late, migration 0022).
SELECT * FROM taskplat_complete_late(%(task_id)s::uuid, %(attempt)s::integer,
                                     %(lease_token)s::uuid, %(result)s::jsonb,
                                     %(trace_context)s::jsonb, %(now)s::timestamptz)

-- name: dead_letter
-- The dead-letter record of a Dead task, as every service writes it (taskplat_dead_letter,
-- migration 0020).
SELECT count(*) AS written
FROM taskplat_dead_letter(ARRAY[%(task_id)s::uuid], %(now)s::timestamptz,
                          %(trace_context)s::jsonb)

-- name: attempts_closed_with
SELECT count(*) AS n
FROM task_attempts
WHERE outcome = %(outcome)s AND finished_at = %(finished_at)s

-- name: task_row
SELECT * FROM tasks WHERE task_id = %(task_id)s

-- name: attempt_rows
SELECT * FROM task_attempts WHERE task_id = %(task_id)s ORDER BY attempt

-- name: outbox_rows
SELECT * FROM outbox WHERE task_id = %(task_id)s ORDER BY outbox_id

-- name: all_outbox_rows
SELECT * FROM outbox ORDER BY outbox_id

-- name: all_tasks
SELECT * FROM tasks ORDER BY task_id

-- name: row_counts
SELECT (SELECT count(*) FROM tasks) AS tasks,
       (SELECT count(*) FROM task_attempts) AS task_attempts,
       (SELECT count(*) FROM task_outputs) AS task_outputs,
       (SELECT count(*) FROM task_events) AS task_events,
       (SELECT count(*) FROM outbox) AS outbox

-- name: set_queue_paused
-- The registry row of a queue, paused or not (the dispatcher's PUT /queues/{queue}/pause sets it).
INSERT INTO queues (name, paused, paused_at)
VALUES (%(queue)s, %(paused)s, CASE WHEN %(paused)s THEN now() END)
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at

-- name: set_queue_sqs_missing
-- The registry row of a queue, held by the relay because its SQS queue does not exist, or not
-- (the state the relay's hold_missing_queues and found_again write, migration 0025).
INSERT INTO queues (name, sqs_missing_since, sqs_next_probe_at)
SELECT %(queue)s, CASE WHEN %(missing)s THEN now() END, CASE WHEN %(missing)s THEN now() END
ON CONFLICT (name) DO UPDATE
SET sqs_missing_since = EXCLUDED.sqs_missing_since, sqs_next_probe_at = EXCLUDED.sqs_next_probe_at
