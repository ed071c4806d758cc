-- The relay may skip the wake-up of a task that is no longer Queued when it gets to the row.
--
-- Invariants:
--   * sent_at keeps meaning "this row left the outbox" (a row is pending while sent_at IS NULL), so
--     the pending index, the gauges and the pruning are unchanged;
--   * skipped = true marks a row the relay marked sent WITHOUT sending anything: an `enqueue_task`
--     row whose task was not Queued (claimed, canceled, finished or gone) in the snapshot of the
--     relay's claim statement. send_attempts is not incremented for it. Only `enqueue_task` rows
--     are ever skipped; a `dead_letter` row is always sent;
--   * this is safe because every transition into Queued (POST /tasks, Scheduled -> Queued, the
--     retry Failed -> Queued, a replay) and every re-published wake-up writes its own
--     `enqueue_task` row in the same transaction: a task that is Queued when its row is claimed
--     always gets its message, and a task that becomes Queued again later has a newer pending row.
-- A NOT NULL column with a constant default is a catalog-only change (no table rewrite).

ALTER TABLE outbox ADD COLUMN skipped boolean NOT NULL DEFAULT false;
