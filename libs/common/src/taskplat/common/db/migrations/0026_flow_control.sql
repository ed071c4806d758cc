-- Flow control: a task's priority, honoured by claim-next.
--
-- A task has `priority`, 0-9, lower first, default 5 (a create names it; a job's tasks take the
-- job's). Claim-next takes the claimable tasks of a queue by priority, then queued_at: strict,
-- no aging. Claims by id are unchanged (they name their task).
--
-- Invariants:
--   * tasks.priority and jobs.priority are 0-9 (CHECK), 5 when not given;
--   * taskplat_new_task carries the priority of a new task (NULL: 5); taskplat_create_tasks, the
--     one home of every creation, writes it; taskplat_start_job_run gives a run its job's;
--   * taskplat_claim_next picks in (priority, queued_at) order through
--     tasks_queued_priority_idx (queue, priority, queued_at) WHERE Queued, an ordered walk that
--     stops after its LIMIT, and answers its tasks in that order;
--   * tasks_queued_idx (queue, queued_at) stays: the relay's hold depth and the queue listing read
--     the oldest Queued tasks of a queue whatever their priority.

ALTER TABLE tasks ADD COLUMN priority smallint NOT NULL DEFAULT 5
    CONSTRAINT tasks_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 5
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN 0 AND 9);

CREATE INDEX tasks_queued_priority_idx ON tasks (queue, priority, queued_at)
    WHERE status = 'Queued';

-- task_details lists t.*, expanded when the view was made: made again to show priority.
DROP VIEW task_details;
CREATE VIEW task_details AS
SELECT
    t.*,
    t.attempt - t.replay_offset - t.processing_attempts AS counted_attempts,
    coalesce((
        SELECT json_agg(json_build_object(
                   'attempt', a.attempt, 'worker_id', a.worker_id, 'started_at', a.started_at,
                   'finished_at', a.finished_at, 'outcome', a.outcome, 'error', a.error)
               ORDER BY a.attempt)
        FROM task_attempts AS a WHERE a.task_id = t.task_id), '[]'::json) AS attempts,
    coalesce((
        SELECT json_agg(json_build_object(
                   'output_index', o.output_index, 'attempt', o.attempt,
                   'dataset_uuid', o.dataset_uuid, 'dataset_version', o.dataset_version,
                   'location', o.location, 'cursor', o."cursor", 'row_count', o.row_count,
                   'committed_at', o.committed_at)
               ORDER BY o.output_index)
        FROM task_outputs AS o WHERE o.task_id = t.task_id), '[]'::json) AS outputs
FROM tasks AS t;

ALTER TYPE taskplat_new_task ADD ATTRIBUTE priority integer;

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
BEGIN
    IF coalesce(cardinality(p_tasks), 0) = 0 THEN
        RETURN;
    END IF;
    WITH inserted AS (
        INSERT INTO tasks AS t (
            task_id, status, queue, operator, job, config, inputs, max_attempts,
            max_processing_attempts, on_exhausted, backoff_base_seconds, backoff_max_seconds,
            timeout_seconds, scheduled_for, expires_at, idempotency_key, queued_at, created_at,
            updated_at, trace_context, priority)
        SELECT n.task_id,
               CASE WHEN n.scheduled_for > v_now THEN 'Scheduled' ELSE 'Queued' END,
               n.queue, n.operator, n.job, coalesce(n.config, '{}'::jsonb),
               coalesce(n.inputs, '[]'::jsonb), n.max_attempts,
               coalesce(n.max_processing_attempts, 10), coalesce(n.on_exhausted, 'dead_letter'),
               n.backoff_base_seconds, n.backoff_max_seconds, n.timeout_seconds,
               n.scheduled_for, n.expires_at, n.idempotency_key,
               CASE WHEN n.scheduled_for > v_now THEN NULL ELSE v_now END,
               v_now, v_now, p_trace_context, coalesce(n.priority, 5)
        FROM unnest(p_tasks) WITH ORDINALITY AS n
        ORDER BY n.ordinality
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING t.task_id, t.job, t.inputs
    ),
    pinned AS (  -- runs although nothing reads it (a data-modifying CTE)
        INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
        SELECT p.dataset_uuid, p.dataset_version, i.task_id
        FROM inserted AS i,
             taskplat_input_pins(CASE WHEN i.job IS NOT NULL THEN i.inputs END) AS p
    )
    SELECT array_agg(i.task_id) INTO v_ids FROM inserted AS i;
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
    SELECT t, coalesce(w.held, false)
    FROM unnest(p_tasks) WITH ORDINALITY AS n
    JOIN tasks AS t ON t.task_id = n.task_id
    LEFT JOIN woken AS w ON w.task_id = n.task_id
    CROSS JOIN notified
    WHERE n.task_id = ANY (v_ids)
    ORDER BY n.ordinality;
END
$$;

CREATE OR REPLACE FUNCTION taskplat_start_job_run(
    p_dag_name text,
    p_job_name text,
    p_inputs jsonb,
    p_extra_config jsonb,
    p_idempotency_key text,
    p_now timestamptz,
    p_trace_context jsonb,
    p_task_id uuid DEFAULT NULL,
    p_hold_seconds double precision DEFAULT 0
) RETURNS uuid
LANGUAGE sql AS $$
    SELECT (c.task).task_id
    FROM jobs AS j,
         taskplat_create_tasks(
             ARRAY[ROW(coalesce(p_task_id, gen_random_uuid()), j.queue, j.operator,
                       jsonb_build_object('dag_name', j.dag_name, 'name', j.name),
                       j.config || coalesce(p_extra_config, '{}'::jsonb),
                       coalesce(p_inputs, '[]'::jsonb), j.max_attempts, NULL, j.on_exhausted,
                       j.backoff_base_seconds, j.backoff_max_seconds, j.timeout_seconds, NULL,
                       NULL, p_idempotency_key, j.priority)::taskplat_new_task],
             p_now, p_trace_context, p_hold_seconds) AS c
    WHERE j.dag_name = p_dag_name AND j.name = p_job_name
$$;

CREATE OR REPLACE FUNCTION taskplat_claim_next(
    p_queue text,
    p_max integer,
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_now timestamptz DEFAULT NULL,
    p_capability_keys boolean DEFAULT true,
    p_untrusted_operators text[] DEFAULT '{}'
) RETURNS SETOF taskplat_claimed_task
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (migration 0020)
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_picked uuid[];
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused, trusted unless the claimer holds
    -- capability keys) and not a `runtime: lambda` job's
    -- task (the relay claims those for their function); rows others are claiming are skipped.
    -- Order: priority (lower first), then queued_at: tasks_queued_priority_idx's order.
    v_picked := ARRAY(
        SELECT t.task_id
        FROM tasks AS t
        WHERE t.status = 'Queued'
          AND t.queue = p_queue
          AND (t.expires_at IS NULL OR t.expires_at > v_now)
          AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = p_queue AND q.paused)
          AND (t.job IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs AS j
                              WHERE j.dag_name = t.job ->> 'dag_name'
                                AND j.name = t.job ->> 'name'
                                AND j.runtime = 'lambda'))
          AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
        ORDER BY t.queue, t.priority, t.queued_at
        LIMIT p_max
        FOR UPDATE OF t SKIP LOCKED);
    IF cardinality(v_picked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.* FROM taskplat_start_attempts(v_picked, v_now, p_worker_id, p_lease_seconds,
                                            p_default_timeout_seconds, NULL, NULL, 0,
                                            p_capability_keys, p_untrusted_operators) AS s
    ORDER BY array_position(v_picked, s.task_id);
END
$$;

COMMENT ON FUNCTION taskplat_claim_next(text, integer, text, double precision, integer,
                                        timestamptz, boolean, text[]) IS
    'Claims up to p_max claimable tasks of a queue, by priority then oldest first, skipping '
    'locked rows and the tasks of runtime: lambda jobs.';
