-- Rows of the claim-guard test (tests/schema/test_claim_guards.py): tasks in every state, made
-- directly (the test is about what the claim does with them, not how they got there).

-- name: insert_task
INSERT INTO tasks (task_id, status, queue, operator, job, max_attempts, backoff_base_seconds,
                   backoff_max_seconds, timeout_seconds, expires_at, next_retry_at, lease_token,
                   lease_expires_at, finished_at, scheduled_for, queued_at, created_at,
                   updated_at)
VALUES (%(task_id)s, %(status)s, %(queue)s, 'probe', %(job)s, 3, 1, 60, 30, %(expires_at)s,
        CASE WHEN %(status)s = 'Failed' THEN %(now)s::timestamptz END,
        CASE WHEN %(status)s = 'Running' THEN gen_random_uuid() END,
        CASE WHEN %(status)s = 'Running' THEN %(now)s::timestamptz END,
        CASE WHEN %(status)s IN ('Completed', 'Dead', 'Canceled') THEN %(now)s::timestamptz END,
        CASE WHEN %(status)s = 'Scheduled' THEN %(now)s::timestamptz + interval '1 hour' END,
        %(now)s, %(now)s, %(now)s)

-- name: insert_lambda_job
-- A `runtime: lambda` job %(dag)s.fn of queue %(queue)s.
WITH dag AS (
    INSERT INTO dags (dag_name, document, document_hash, created_at, updated_at)
    VALUES (%(dag)s, '{}', 'h', now(), now())
)
INSERT INTO jobs (dag_name, name, operator, runtime, queue, config, trust, max_attempts,
                  backoff_base_seconds, backoff_max_seconds, timeout_seconds)
VALUES (%(dag)s, 'fn', 'probe', 'lambda', %(queue)s, '{}', 'trusted', 3, 1, 60, 30)

-- name: pause_queue
INSERT INTO queues (name, paused) VALUES (%(queue)s, true)
ON CONFLICT (name) DO UPDATE SET paused = true

-- name: attempts
SELECT count(*) AS attempts FROM task_attempts WHERE task_id = %(task_id)s

-- name: insert_untrusted_job
-- A job %(dag)s.udf of runtime %(runtime)s (`ecs` or `lambda`) and queue %(queue)s that says
-- `trust: untrusted`.
WITH dag AS (
    INSERT INTO dags (dag_name, document, document_hash, created_at, updated_at)
    VALUES (%(dag)s, '{}', 'h', now(), now())
)
INSERT INTO jobs (dag_name, name, operator, runtime, queue, config, trust, max_attempts,
                  backoff_base_seconds, backoff_max_seconds, timeout_seconds)
VALUES (%(dag)s, 'udf', 'probe', %(runtime)s, %(queue)s, '{}', 'untrusted', 3, 1, 60, 30)

-- name: task_version
-- The task row's version and lock state: xmin changes on any write, xmax on a row lock too.
SELECT xmin::text AS xmin, xmax::text AS xmax, status, attempt FROM tasks
WHERE task_id = %(task_id)s
