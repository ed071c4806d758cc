-- Setup and inspection rows of the relay's skip tests (not product code): move a task the way the
-- dispatcher, the scheduler or the reaper would, without touching its outbox rows.

-- name: claim_tasks
-- The claim every service makes (taskplat_claim, migration 0020): e.g. a wrapper claiming ahead.
SELECT task_id FROM taskplat_claim(%(task_ids)s::uuid[], 'w-test', 30, 3600)

-- name: cancel_tasks
UPDATE tasks
SET status = 'Canceled', finished_at = now()
WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: delete_tasks
-- As the reaper's pruning (the outbox row has no foreign key to its task).
DELETE FROM tasks WHERE task_id = ANY(%(task_ids)s::uuid[])

-- name: requeue_with_wakeup
-- As the scheduler's retry: Running -> Queued as the next attempt, with a new enqueue_task row.
WITH moved AS (
    UPDATE tasks
    SET status = 'Queued', attempt = attempt + 1, lease_token = NULL, lease_expires_at = NULL,
        worker_id = NULL, started_at = NULL, queued_at = coalesce(%(now)s::timestamptz, now())
    WHERE task_id = %(task_id)s
    RETURNING task_id, queue
)
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at)
SELECT 'enqueue_task', m.task_id, m.queue, jsonb_build_object('task_id', m.task_id::text),
       n.now, n.now
FROM moved AS m, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS n
RETURNING outbox_id

-- name: skip_marks
SELECT outbox_id, task_id, kind, sent_at, skipped, send_attempts
FROM outbox
ORDER BY outbox_id
