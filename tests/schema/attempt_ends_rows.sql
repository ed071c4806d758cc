-- Rows of the attempt-end test (tests/schema/test_attempt_ends.py). A task is made Queued
-- directly (the test is about how its attempt ends, not how it was created), then claimed and
-- ended by the services' own statements.

-- name: insert_task
INSERT INTO tasks (task_id, status, queue, operator, max_attempts, max_processing_attempts,
                   backoff_base_seconds, backoff_max_seconds, timeout_seconds, queued_at,
                   created_at, updated_at)
VALUES (%(task_id)s, 'Queued', 'default', 'probe', %(max_attempts)s,
        %(max_processing_attempts)s, 1, 60, 30, %(now)s, %(now)s, %(now)s)

-- name: task
SELECT * FROM tasks WHERE task_id = %(task_id)s

-- name: attempt_record
SELECT * FROM task_attempts WHERE task_id = %(task_id)s

-- name: dead_letters
SELECT created_at, available_at, payload - 'task_id' AS payload
FROM outbox
WHERE task_id = %(task_id)s AND kind = 'dead_letter'

-- name: function_source
SELECT p.prosrc AS source FROM pg_proc AS p WHERE p.proname = %(name)s
