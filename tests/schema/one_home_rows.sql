-- Rows of the task-creation test (tests/schema/test_task_creation.py).

-- name: function_sources
-- Every function of the schema with its source.
SELECT p.proname AS name, p.prosrc AS source
FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'

-- name: insert_job
-- A job %(dag)s.run of queue %(queue)s (an `ecs` job, trusted).
WITH dag AS (
    INSERT INTO dags (dag_name, document, document_hash, created_at, updated_at)
    VALUES (%(dag)s, '{}', 'h', now(), now())
)
INSERT INTO jobs (dag_name, name, operator, runtime, queue, config, trust, max_attempts,
                  backoff_base_seconds, backoff_max_seconds, timeout_seconds, on_exhausted)
VALUES (%(dag)s, 'run', 'probe', 'ecs', %(queue)s, '{"a": 1}', 'trusted', 4, 1, 60, 30,
        'discard')

-- name: poll_queue
-- The queue's workers wait on a dispatcher (migration 0016) until %(until)s.
INSERT INTO queues (name, polled_until) VALUES (%(queue)s, %(until)s)
ON CONFLICT (name) DO UPDATE SET polled_until = EXCLUDED.polled_until

-- name: start_job_run
SELECT taskplat_start_job_run(%(dag)s, 'run', '[]'::jsonb, NULL, %(key)s, %(now)s, NULL,
                              p_hold_seconds => %(hold)s) AS task_id

-- name: task
SELECT * FROM tasks WHERE task_id = %(task_id)s

-- name: wakeups
SELECT held, available_at FROM outbox WHERE task_id = %(task_id)s AND kind = 'enqueue_task'

-- name: explain_pick
-- Claim-next's pick (taskplat_claim_next), planned with its parameters.
EXPLAIN (VERBOSE, FORMAT JSON)
SELECT t.task_id
FROM tasks AS t
WHERE t.status = 'Queued'
  AND t.queue = 'q'
  AND taskplat_claimable(t, now(), false, ARRAY['untrusted-op'])
ORDER BY t.queue, t.priority, t.pass, t.queued_at
LIMIT 10
FOR UPDATE OF t SKIP LOCKED
