-- Batches of the reaper loop.
--
-- The timeouts are SQL functions of migration 0020 (taskplat_reap_timeouts,
-- taskplat_expire_unstarted), which state their guards: each is a bounded FOR UPDATE SKIP LOCKED
-- selection, an UPDATE guarded by the status, attempt and lease token it selected (for the
-- timeouts, the end every attempt shares: taskplat_end_running, migration 0022), the attempt
-- history row closed, and the dead-letter record (taskplat_dead_letter) of each task that became
-- Dead. A completion or heartbeat that holds the row lock makes the reaper skip the row; one that
-- committed after the statement's snapshot is seen when the lock is taken, and the re-checked
-- guard then excludes the row, so the reaper never overwrites it.
-- Time is coalesce(%(now)s::timestamptz, now()). Jitter for the retry delay comes from the caller,
-- one value per selected row (%(jitters)s, indexed by row number). Transitions return each moved
-- task's task_id, attempt, new status, queue, operator and dead_reason (timeouts also worker_id and
-- next_retry_at), for logs and metrics. The pruning is the reaper's alone and stays here.

-- name: reap_timeouts
-- Running attempts that timed out (taskplat_reap_timeouts, migration 0020, states the rule): the
-- lease ran out (LeaseExpired) or deadline_at + %(grace_seconds)s passed (DeadlineExceeded); the
-- task is Failed with a retry, or Dead with its dead-letter record. Returns `ended` per task too.
SELECT * FROM taskplat_reap_timeouts(%(now)s::timestamptz, %(grace_seconds)s::double precision,
                                     %(limit)s::integer, %(jitters)s::double precision[])

-- name: expire_unstarted
-- Queued or Scheduled past expires_at: Dead (Expired), with the dead-letter record
-- (taskplat_expire_unstarted, migration 0020). A Running task is never expired.
SELECT * FROM taskplat_expire_unstarted(%(now)s::timestamptz, %(limit)s::integer)

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
