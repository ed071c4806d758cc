-- Keep the hot tables cheap to write and their plans flat however much history they hold.
--
-- Invariants:
--   * a live task (Scheduled, Queued, Running, Failed) is indexed only by the primary key, the
--     listing index tasks_created_idx, the idempotency key and the partial index of its status.
--     Listing by status reads one partial index: a terminal status its own (created_at DESC,
--     task_id DESC) index, in order; a live status the partial index of that status (a small set),
--     sorted. This replaces tasks_status_created_idx, which every live row version entered.
--   * no index holding live rows can serve `WHERE task_id = $1 AND status = '<S>'` (every guarded
--     transition) by a range of that status: with tasks_status_created_idx, on stale statistics
--     (a young table, or a history loaded in bulk, before autoanalyze) the planner read every
--     entry of the status, dead ones included, instead of the primary key. The one remaining case
--     (tests/schema/test_hot_plans.py) is the dead-letter insert reading the Dead listing index
--     whole on statistics taken before any task died: once per task that dies, until autoanalyze.
--   * tasks_finished_at_idx (replacing tasks_finished_idx) holds the rows with finished_at set:
--     exactly the terminal tasks, since every transition into a terminal status sets finished_at
--     and every transition out of one clears it. The reaper's pruning and the Dead gauge name a
--     finished_at range and still use it; a transition that names a terminal status by task_id (a
--     replay, a dead letter, the pruning's delete) can no longer be planned as a read of the whole
--     index, which the planner did on statistics taken before the history existed.
--   * outbox_sent_idx stays: the reaper prunes sent rows through it (without it each prune is a
--     sequential scan of the outbox).
--   * the hot tables are analysed and vacuumed more often than the defaults (20% of the table
--     changed before a vacuum, 10% before an analyze): their live rows are a small, fast-changing
--     part of a large table, and plans depend on up-to-date counts per status.
--
-- Measured (issue 7, 10,000 task lives on 1M finished tasks): one index insertion less per live
-- row version, 3.6% less WAL and 9% fewer buffer accesses per task. fillfactor was measured and
-- left at 100: no update of tasks or outbox can be HOT (each changes an indexed column or a
-- partial-index predicate column), and task_attempts' one update is already HOT.
--
-- On a large existing table, build the new indexes first by hand without blocking writes
-- (`CREATE INDEX CONCURRENTLY ...` with the definitions below); this migration then only drops the
-- old one.

CREATE INDEX IF NOT EXISTS tasks_completed_created_idx
    ON tasks (created_at DESC, task_id DESC) WHERE status = 'Completed';
CREATE INDEX IF NOT EXISTS tasks_dead_created_idx
    ON tasks (created_at DESC, task_id DESC) WHERE status = 'Dead';
CREATE INDEX IF NOT EXISTS tasks_canceled_created_idx
    ON tasks (created_at DESC, task_id DESC) WHERE status = 'Canceled';
DROP INDEX tasks_status_created_idx;
CREATE INDEX IF NOT EXISTS tasks_finished_at_idx
    ON tasks (finished_at) WHERE finished_at IS NOT NULL;
DROP INDEX tasks_finished_idx;

ALTER TABLE tasks SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE task_attempts SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
