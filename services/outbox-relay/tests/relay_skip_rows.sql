-- Setup and inspection rows of the relay's skip tests (not product code): move a task through the
-- functions the dispatcher, the scheduler and the reaper move it with (migration 0020); a cancel
-- and a prune are set as states (the relay only reads that the task is no longer Queued).

-- name: claim_tasks
-- The claim every service makes (taskplat_claim, migration 0020): e.g. a wrapper claiming ahead.
SELECT task_id FROM taskplat_claim(%(task_ids)s::uuid[], 'w-test', 30, 3600)

-- name: cancel_tasks
-- A Canceled task, as a state.
UPDATE tasks
SET status = 'Canceled', finished_at = now()
WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: delete_tasks
-- As the reaper's pruning (the outbox row has no foreign key to its task).
DELETE FROM tasks WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: claim_tasks_at
SELECT task_id FROM taskplat_claim(%(task_ids)s::uuid[], 'w-test', 30, 3600, %(now)s::timestamptz)

-- name: reap_timeouts
-- The reaper's timeouts (taskplat_reap_timeouts, migration 0020): a lease that ran out by %(now)s
-- ends its attempt, and the task waits Failed for its retry.
SELECT task_id, status FROM taskplat_reap_timeouts(%(now)s::timestamptz, 0, 100, ARRAY[0.5])

-- name: queue_due
-- The scheduler's retry (taskplat_queue_due, migration 0020): a retry due by %(now)s is Queued as
-- the next attempt, with a new wake-up.
SELECT task_id, moved_from FROM taskplat_queue_due(%(now)s::timestamptz, 100, 100)

-- name: skip_marks
SELECT outbox_id, task_id, kind, sent_at, skipped, send_attempts
FROM outbox
ORDER BY outbox_id
