-- Keep queued_at meaning "when the task last became Queued" (schedule lag is measured from it).
--
-- The scheduler re-publishes a wake-up for a Queued task nobody claimed; it records that in
-- last_wakeup_at instead of moving queued_at. A task is due for another wake-up once
-- greatest(queued_at, last_wakeup_at) is older than the scheduler's requeue period (greatest()
-- ignores NULLs, so nothing else has to reset the column when a task is queued again).

ALTER TABLE tasks ADD COLUMN last_wakeup_at timestamptz;

DROP INDEX tasks_queued_idx;
CREATE INDEX tasks_queued_idx ON tasks (queue, queued_at) WHERE status = 'Queued';
CREATE INDEX tasks_queued_wakeup_idx ON tasks ((greatest(queued_at, last_wakeup_at)))
    WHERE status = 'Queued';
