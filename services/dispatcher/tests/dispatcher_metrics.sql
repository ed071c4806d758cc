-- Test setup for the dispatcher's metrics tests (not product code).
--
-- `install_poison_triggers` makes a later statement of a transition's transaction fail after the
-- guarded UPDATE succeeded (a data exception, SQLSTATE class 22, answered 422), so a test can
-- check that a rolled-back transition is neither counted nor logged. `fill_finished_tasks` and
-- `fill_sent_outbox` build the history a long-running platform accumulates.

-- name: install_poison_triggers
CREATE FUNCTION taskplat_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'poisoned row for a rollback test' USING ERRCODE = '22023';
END
$$;
CREATE TRIGGER taskplat_test_poison_outputs BEFORE INSERT ON task_outputs
    FOR EACH ROW WHEN (NEW.location = 'poison') EXECUTE FUNCTION taskplat_test_poison();
CREATE TRIGGER taskplat_test_poison_outbox BEFORE INSERT ON outbox
    FOR EACH ROW WHEN (NEW.queue = 'poison') EXECUTE FUNCTION taskplat_test_poison();

-- name: fill_finished_tasks
-- `count` finished tasks, one every 3 seconds back from `now` (200k span about a week): every 50th
-- Dead, every 33rd Canceled, the rest Completed, over 8 queues and 5 operators.
INSERT INTO tasks (task_id, status, queue, operator, max_attempts, backoff_base_seconds,
                   backoff_max_seconds, attempt_outcome, dead_reason, last_error, lease_token,
                   worker_id, queued_at, created_at, started_at, finished_at, updated_at)
SELECT gen_random_uuid(), s.status, 'q' || (g.i %% 8), 'op' || (g.i %% 5), 3, 1, 300,
       CASE s.status WHEN 'Dead' THEN 'Failed' WHEN 'Canceled' THEN NULL ELSE 'Completed' END,
       CASE WHEN s.status = 'Dead' THEN 'AttemptsExhausted' END,
       CASE WHEN s.status = 'Dead' THEN 'boom' END,
       gen_random_uuid(), 'worker-' || (g.i %% 20),
       f.at - interval '2 minutes', f.at - interval '2 minutes', f.at - interval '1 minute',
       f.at, f.at
FROM generate_series(1, %(count)s) AS g(i)
CROSS JOIN LATERAL (
    SELECT CASE WHEN g.i %% 50 = 0 THEN 'Dead' WHEN g.i %% 33 = 0 THEN 'Canceled'
                ELSE 'Completed' END AS status
) AS s
CROSS JOIN LATERAL (SELECT %(now)s::timestamptz - make_interval(secs => g.i * 3) AS at) AS f

-- name: fill_sent_outbox
-- One sent `enqueue_task` row per finished task.
INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at, send_attempts,
                    sent_at)
SELECT 'enqueue_task', task_id, queue, jsonb_build_object('task_id', task_id::text),
       created_at, created_at, 1, created_at + interval '1 second'
FROM tasks
WHERE status IN ('Completed', 'Dead', 'Canceled')

-- name: analyze
ANALYZE tasks, outbox
