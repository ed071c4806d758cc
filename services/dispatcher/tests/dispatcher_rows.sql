-- Test setup and inspection for the dispatcher's tests (not product code).
--
-- The reaper and the scheduler do not exist yet: `emulate_lease_expired` and
-- `emulate_retry_promoted` stand in for their guarded transitions so the tests can reach the
-- states the API cannot (a timed-out attempt, a newer attempt started by a retry).

-- name: emulate_lease_expired
-- The reaper's lease timeout: Running -> Failed (retry pending) or Dead (budget used up).
UPDATE tasks AS t
SET status = CASE WHEN t.attempt - t.replay_offset >= t.max_attempts THEN 'Dead' ELSE 'Failed' END,
    attempt_outcome = 'LeaseExpired',
    dead_reason = CASE
        WHEN t.attempt - t.replay_offset >= t.max_attempts THEN 'AttemptsExhausted'
    END,
    next_retry_at = CASE
        WHEN t.attempt - t.replay_offset >= t.max_attempts THEN NULL ELSE %(now)s::timestamptz
    END,
    finished_at = CASE
        WHEN t.attempt - t.replay_offset >= t.max_attempts THEN %(now)s::timestamptz
    END,
    last_error = 'lease expired',
    lease_expires_at = NULL,
    updated_at = %(now)s::timestamptz
WHERE t.task_id = %(task_id)s
  AND t.status = 'Running'
  AND t.attempt = %(attempt)s
  AND t.lease_token = %(lease_token)s
RETURNING t.status

-- name: emulate_attempt_lease_expired
UPDATE task_attempts
SET outcome = 'LeaseExpired', error = 'lease expired', finished_at = %(now)s::timestamptz
WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND outcome IS NULL

-- name: emulate_retry_promoted
-- The scheduler's retry: Failed -> Queued with the next attempt, plus its wake-up outbox row.
UPDATE tasks AS t
SET status = 'Queued',
    attempt = t.attempt + 1,
    next_retry_at = NULL,
    queued_at = %(now)s::timestamptz,
    updated_at = %(now)s::timestamptz
WHERE t.task_id = %(task_id)s
  AND t.status = 'Failed'
  AND t.attempt = %(attempt)s
RETURNING t.task_id, t.queue, t.attempt

-- name: emulate_retry_outbox
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at)
VALUES ('enqueue_task', %(task_id)s::uuid, %(queue)s,
        jsonb_build_object('task_id', %(task_id)s::text), %(now)s::timestamptz,
        %(now)s::timestamptz)

-- name: row_counts
SELECT (SELECT count(*) FROM tasks) AS tasks,
       (SELECT count(*) FROM task_attempts) AS task_attempts,
       (SELECT count(*) FROM task_outputs) AS task_outputs,
       (SELECT count(*) FROM task_events) AS task_events,
       (SELECT count(*) FROM outbox) AS outbox

-- name: task_row
SELECT * FROM tasks WHERE task_id = %(task_id)s

-- name: attempt_rows
SELECT * FROM task_attempts WHERE task_id = %(task_id)s ORDER BY attempt

-- name: outbox_rows
SELECT * FROM outbox WHERE task_id = %(task_id)s ORDER BY outbox_id

-- name: event_rows
SELECT * FROM task_events WHERE task_id = %(task_id)s ORDER BY event_id

-- name: output_rows
SELECT * FROM task_outputs WHERE task_id = %(task_id)s ORDER BY output_index

-- name: task_xmin
-- The transaction that last wrote the task row (xmin), to prove two rows share one transaction.
SELECT xmin::text AS xmin FROM tasks WHERE task_id = %(task_id)s

-- name: outbox_xmins
SELECT xmin::text AS xmin FROM outbox WHERE task_id = %(task_id)s ORDER BY outbox_id
