-- Rows and calls of the flow-control tests (tests/schema/test_flow_limits.py). Tasks are made by
-- the one creation function and claimed by the dispatcher's own statements; the ends below are
-- the end functions every service calls (migrations 0022, 0023).

-- name: set_limits
SELECT * FROM taskplat_set_queue_limits(%(queue)s, %(concurrency)s, %(key_concurrency)s,
                                        %(per_second)s, %(burst)s)

-- name: create
-- %(keys)s and %(priorities)s: one element per task, in order.
SELECT (c.task).task_id
FROM taskplat_create_tasks(
    ARRAY(SELECT ROW(gen_random_uuid(), %(queue)s::text, 'probe', NULL, NULL, NULL, 3, NULL,
                     NULL, 1, 60, 30, NULL, NULL, NULL, p.priority, p.key)::taskplat_new_task
          FROM unnest(%(keys)s::text[], %(priorities)s::integer[]) WITH ORDINALITY
               AS p(key, priority, position)
          ORDER BY p.position)) AS c

-- name: complete
SELECT task_id FROM taskplat_end_running(
    ARRAY[%(task_id)s::uuid], ARRAY[%(attempt)s::integer], ARRAY[%(lease_token)s::uuid],
    ARRAY[%(ended)s::text], ARRAY[true], ARRAY['{}'::jsonb], ARRAY['e'::text],
    ARRAY[NULL::double precision], ARRAY[0::double precision], ARRAY[NULL::text])

-- name: cancel
SELECT task_id FROM taskplat_cancel_tasks(ARRAY[%(task_id)s::uuid], 'Requested')

-- name: reap
-- Every lease and deadline ran out: the reaper's statement, an hour from now.
SELECT task_id, ended FROM taskplat_reap_timeouts(now() + interval '1 hour', 0, 1000,
                                                  ARRAY[0::double precision])

-- name: counters
SELECT q.running,
       coalesce((SELECT json_object_agg(k.concurrency_key, k.running) FROM queue_keys AS k
                 WHERE k.queue = q.name AND k.running <> 0), '{}') AS keys,
       (SELECT count(*) FROM tasks AS t WHERE t.queue = q.name AND t.status = 'Running')
           AS truly_running,
       coalesce((SELECT json_object_agg(r.key, r.n) FROM (
                     SELECT coalesce(t.concurrency_key, '') AS key, count(*) AS n
                     FROM tasks AS t WHERE t.queue = q.name AND t.status = 'Running'
                     GROUP BY 1) AS r), '{}') AS truly_keys
FROM queues AS q WHERE q.name = %(queue)s

-- name: refusal
SELECT * FROM taskplat_limit_refusal(%(queue)s, %(key)s)

-- name: intervals
-- Every attempt of the queue's tasks: its key, when it started, when it ended (NULL: running).
SELECT coalesce(t.concurrency_key, '') AS key, a.started_at, a.finished_at
FROM task_attempts AS a JOIN tasks AS t ON t.task_id = a.task_id
WHERE t.queue = %(queue)s
ORDER BY a.started_at

-- name: attempts_of
SELECT count(*) AS n FROM task_attempts WHERE task_id = %(task_id)s
