-- Batches of the reaper loop.
--
-- Each transition is one statement: a bounded FOR UPDATE SKIP LOCKED selection, an UPDATE guarded by
-- the status, attempt and lease token it selected, the attempt history row closed, and a
-- `dead_letter` outbox row (taskplat_dead_letter, migration 0020, like every dead-letter record) for
-- each task that became Dead. A completion or heartbeat that holds the row lock makes the reaper skip the row;
-- one that committed after this statement's snapshot is seen when the lock is taken, and the
-- re-checked predicate and guard then exclude the row, so the reaper never overwrites it.
-- Time is coalesce(%(now)s::timestamptz, now()). Jitter for the retry delay comes from the caller,
-- one value per selected row (%(jitters)s, indexed by row number). Transitions return each moved
-- task's task_id, attempt, new status, queue, operator and dead_reason (timeouts also worker_id and
-- next_retry_at), for logs and metrics.

-- name: reap_timeouts
-- Running attempts that timed out: the lease ran out (LeaseExpired: the worker vanished, which is
-- not the task's fault), or deadline_at + grace passed even while heartbeats kept the lease fresh
-- (DeadlineExceeded); an attempt that did both is LeaseExpired. The task's fate is the rule every
-- ended attempt follows (taskplat_ended_status, migration 0008): Failed with a retry at
-- now + backoff, or Dead (AttemptsExhausted after a deadline overrun, ProcessingAttemptsExceeded
-- after too many lost workers). The lease token stays on the row so a late success of this same
-- attempt can still be recognised. Returns `ended` (the attempt's outcome) per task as well.
WITH n AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           coalesce(%(now)s::timestamptz, now())
               - make_interval(secs => %(grace_seconds)s::double precision) AS overrun
),
due AS (
    SELECT t.task_id, t.attempt, t.lease_token,
           CASE WHEN t.lease_expires_at < n.now THEN 'LeaseExpired'
                ELSE 'DeadlineExceeded' END AS ended
    FROM tasks AS t, n
    WHERE t.status = 'Running'
      AND (t.lease_expires_at < n.now OR t.deadline_at < n.overrun)
    ORDER BY least(t.lease_expires_at, t.deadline_at)
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
),
jittered AS (
    SELECT due.*, (%(jitters)s::double precision[])[row_number() OVER ()] AS jitter FROM due
),
moved AS (
    UPDATE tasks AS t
    SET status = taskplat_ended_status(t, j.ended, true),
        attempt_outcome = j.ended,
        last_error = CASE j.ended WHEN 'LeaseExpired' THEN 'lease expired'
                                  ELSE 'deadline exceeded' END,
        dead_reason = taskplat_dead_reason(t, j.ended, true),
        processing_attempts = t.processing_attempts + (j.ended = 'LeaseExpired')::int,
        next_retry_at = taskplat_retry_at(t, j.ended, true, n.now, NULL,
                                          coalesce(j.jitter, 1.0)),
        finished_at = CASE WHEN taskplat_ended_status(t, j.ended, true) = 'Dead' THEN n.now END,
        lease_expires_at = NULL,
        updated_at = n.now
    FROM jittered AS j, n
    WHERE t.task_id = j.task_id
      AND t.status = 'Running'
      AND t.attempt = j.attempt
      AND t.lease_token = j.lease_token
      AND (t.lease_expires_at < n.now OR t.deadline_at < n.overrun)
    RETURNING t.task_id, t.attempt, t.lease_token, t.status, t.queue, t.operator, t.worker_id,
              t.max_attempts, t.dead_reason, t.last_error, t.finished_at, t.next_retry_at,
              j.ended
),
closed AS (
    UPDATE task_attempts AS a
    SET finished_at = n.now, outcome = m.ended, error = m.last_error
    FROM moved AS m, n
    WHERE a.task_id = m.task_id AND a.attempt = m.attempt AND a.lease_token = m.lease_token
      AND a.outcome IS NULL
),
dead AS (  -- taskplat_dead_letter (migration 0020)
    SELECT count(*) AS written
    FROM n, taskplat_dead_letter(ARRAY(SELECT m.task_id FROM moved AS m WHERE m.status = 'Dead'),
                                 n.now)
)
SELECT task_id, attempt, status, queue, operator, worker_id, dead_reason, next_retry_at, ended
FROM moved, dead  -- dead: one row, read so that it runs

-- name: expire_unstarted
-- Queued or Scheduled past expires_at: Dead (Expired). A Running task is never expired.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
due AS (
    SELECT t.task_id, t.attempt, t.status
    FROM tasks AS t, n
    WHERE t.status IN ('Queued', 'Scheduled')
      AND t.expires_at IS NOT NULL
      AND t.expires_at <= n.now
    ORDER BY t.expires_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
),
moved AS (
    UPDATE tasks AS t
    SET status = 'Dead',
        dead_reason = 'Expired',
        last_error = 'expired before it started',
        next_retry_at = NULL,
        lease_expires_at = NULL,
        finished_at = n.now,
        updated_at = n.now
    FROM due, n
    WHERE t.task_id = due.task_id
      AND t.status = due.status
      AND t.attempt = due.attempt
      AND t.expires_at <= n.now
    RETURNING t.task_id, t.attempt, t.status, t.queue, t.operator, t.max_attempts,
              t.dead_reason, t.last_error, t.finished_at, due.status AS expired_from
),
dead AS (  -- taskplat_dead_letter (migration 0020)
    SELECT count(*) AS written
    FROM n, taskplat_dead_letter(ARRAY(SELECT m.task_id FROM moved AS m), n.now)
)
SELECT task_id, attempt, status, queue, operator, dead_reason, expired_from FROM moved, dead

-- name: prune_finished_tasks
-- Terminal tasks finished longer ago than the retention; attempts, outputs and events go with them
-- (ON DELETE CASCADE). The status is re-checked so a task replayed meanwhile is kept. The batch is
-- picked oldest first through tasks_finished_at_idx and deleted by primary key (= ANY of the locked
-- ids): a join with a CTE let the generic plan of this prepared statement, which cannot see the
-- LIMIT, hash-join against a sequential scan of tasks.
DELETE FROM tasks AS t
WHERE t.task_id = ANY (ARRAY(
    SELECT d.task_id
    FROM tasks AS d
    WHERE d.status IN ('Completed', 'Dead', 'Canceled')
      AND d.finished_at < coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => %(retention_seconds)s::double precision)
    ORDER BY d.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED))
  AND t.status IN ('Completed', 'Dead', 'Canceled')
RETURNING t.task_id

-- name: prune_sent_outbox
-- Outbox rows sent (or skipped) longer ago than the retention, oldest first through outbox_sent_idx
-- and deleted by primary key. Pending rows (sent_at IS NULL) are never pruned.
DELETE FROM outbox AS o
WHERE o.outbox_id = ANY (ARRAY(
    SELECT d.outbox_id
    FROM outbox AS d
    WHERE d.sent_at IS NOT NULL
      AND d.sent_at < coalesce(%(now)s::timestamptz, now())
                      - make_interval(secs => %(retention_seconds)s::double precision)
    ORDER BY d.sent_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED))
RETURNING o.outbox_id

-- name: notify_outbox
-- Wake the outbox relay; delivered on commit, so only if the outbox rows were committed.
SELECT pg_notify('taskplat_outbox', q) FROM unnest(%(queues)s::text[]) AS q
