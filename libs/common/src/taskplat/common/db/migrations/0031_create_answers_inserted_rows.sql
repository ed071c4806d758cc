-- A create answers the rows its INSERT returned (docs/performance.md, "W2").
--
-- Invariants:
--   * taskplat_create_tasks answers each inserted task as its INSERT returned it (the whole
--     row, RETURNING), in the order given, with whether its wake-up was held: it reads no task
--     back. Its answer was a join of the new ids with `tasks`, planned once per session
--     (force_generic_plan): planned while `tasks` was small, that join read the whole table
--     (a sequential scan, 0.9 ms at 1,400 rows, growing with history). Nothing writes a new
--     task between its INSERT and the answer (the wake-ups write the outbox only), so the row
--     is the one a read would find.
--   * Everything else is as migration 0028 made it: passes, pins, wake-ups, NOTIFY.

CREATE OR REPLACE FUNCTION taskplat_create_tasks(
    p_tasks taskplat_new_task[],
    p_now timestamptz DEFAULT NULL,
    p_trace_context jsonb DEFAULT NULL,
    p_hold_seconds double precision DEFAULT 0,
    p_notify_held boolean DEFAULT true
) RETURNS TABLE (task tasks, held boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (migration 0020)
AS $$
#variable_conflict use_column
DECLARE
    v_now constant timestamptz := coalesce(p_now, now());
    v_ids uuid[];
    v_rows tasks[];
BEGIN
    IF coalesce(cardinality(p_tasks), 0) = 0 THEN
        RETURN;
    END IF;
    WITH new AS MATERIALIZED (
        SELECT n.*, n.ordinality AS position, coalesce(n.concurrency_key, '') AS key,
               row_number() OVER (PARTITION BY n.queue, coalesce(n.concurrency_key, '')
                                  ORDER BY n.ordinality) AS nth
        FROM unnest(p_tasks) WITH ORDINALITY AS n
    ),
    groups AS MATERIALIZED (  -- each (queue, key) once: where its new tasks' passes start
        SELECT g.queue, g.key,
               greatest(
                   (SELECT f.pass FROM tasks AS f  -- the key's newest Queued task
                    WHERE f.queue = g.queue AND coalesce(f.concurrency_key, '') = g.key
                      AND f.status = 'Queued'
                    ORDER BY f.queue, coalesce(f.concurrency_key, ''), f.pass DESC LIMIT 1),
                   (SELECT f.pass FROM tasks AS f  -- the queue's front at the key's priority
                    WHERE f.queue = g.queue AND f.status = 'Queued' AND f.priority = g.priority
                    ORDER BY f.queue, f.priority, f.pass, f.queued_at LIMIT 1),
                   0) AS base
        FROM (SELECT new.queue, new.key, min(coalesce(new.priority, 5)) AS priority
              FROM new GROUP BY new.queue, new.key) AS g
    ),
    inserted AS (
        INSERT INTO tasks AS t (
            task_id, status, queue, operator, job, config, inputs, max_attempts,
            max_processing_attempts, on_exhausted, backoff_base_seconds, backoff_max_seconds,
            timeout_seconds, scheduled_for, expires_at, idempotency_key, queued_at, created_at,
            updated_at, trace_context, priority, concurrency_key, pass)
        SELECT n.task_id,
               CASE WHEN n.scheduled_for > v_now THEN 'Scheduled' ELSE 'Queued' END,
               n.queue, n.operator, n.job, coalesce(n.config, '{}'::jsonb),
               coalesce(n.inputs, '[]'::jsonb), n.max_attempts,
               coalesce(n.max_processing_attempts, 10), coalesce(n.on_exhausted, 'dead_letter'),
               n.backoff_base_seconds, n.backoff_max_seconds, n.timeout_seconds,
               n.scheduled_for, n.expires_at, n.idempotency_key,
               CASE WHEN n.scheduled_for > v_now THEN NULL ELSE v_now END,
               v_now, v_now, p_trace_context, coalesce(n.priority, 5), n.concurrency_key,
               g.base + n.nth
        FROM new AS n
        JOIN groups AS g ON g.queue = n.queue AND g.key = n.key
        ORDER BY n.position
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING t AS task
    ),
    pinned AS (  -- runs although nothing reads it (a data-modifying CTE)
        INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
        SELECT p.dataset_uuid, p.dataset_version, (i.task).task_id
        FROM inserted AS i,
             taskplat_input_pins(CASE WHEN (i.task).job IS NOT NULL THEN (i.task).inputs END)
                 AS p
    )
    SELECT array_agg((i.task).task_id), array_agg(i.task) INTO v_ids, v_rows
    FROM inserted AS i;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH woken AS MATERIALIZED (
        SELECT w.queue, w.held, w.task_id
        FROM taskplat_enqueue_wakeups(v_ids, v_now, p_trace_context, p_hold_seconds) AS w
    ),
    notified AS MATERIALIZED (
        SELECT count(pg_notify(CASE WHEN x.held THEN 'taskplat_queued' ELSE 'taskplat_outbox' END,
                               x.queue)) AS sent
        FROM (SELECT DISTINCT w.queue, w.held FROM woken AS w) AS x
        WHERE NOT x.held OR p_notify_held
    )
    SELECT r, coalesce(w.held, false)  -- the rows as inserted: no read of `tasks`
    FROM unnest(p_tasks) WITH ORDINALITY AS n
    JOIN unnest(v_rows) AS r ON r.task_id = n.task_id
    LEFT JOIN woken AS w ON w.task_id = n.task_id
    CROSS JOIN notified
    ORDER BY n.ordinality;
END
$$;
