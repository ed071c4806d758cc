-- The creation of a task and its cancellation, one home each: every way a task comes to be is a
-- call of taskplat_create_tasks, every cancel one of taskplat_cancel_tasks.
--
-- Until now a task was inserted in four places: the dispatcher's single and bulk creates (two
-- statements with the same column list) and taskplat_start_job_run (migrations 0005, 0017),
-- which job runs of every kind use (manual runs, cron schedules, runs routed from a dataset
-- event). The job run wrote its own `enqueue_task` row, so it got neither the held wake-up nor
-- the `taskplat_queued` NOTIFY of a create: a DAG's next task waited for the relay and SQS
-- instead of a waiting claim. Now:
--   * taskplat_new_task: the values of a new task (what its creator chooses; the rest is the
--     state every new task starts in);
--   * taskplat_create_tasks(tasks, now, trace_context, hold_seconds, notify_held): inserts them,
--     pins each task of a job to the dataset versions its inputs name, writes the wake-up of
--     each Queued one (taskplat_enqueue_wakeups: held for a queue whose workers wait on a
--     dispatcher) and NOTIFYs who must hear of it;
--   * taskplat_start_job_run: a job's values, then taskplat_create_tasks.
--
-- Invariants:
--   * a new task is Scheduled when scheduled_for is after now, else Queued with queued_at = now;
--     created_at = updated_at = now; its attempt, budgets and state columns take their defaults;
--   * an idempotency key already taken (by an earlier task or an earlier element of the same
--     call) creates nothing for that element; elements are inserted in the order given;
--   * a task of a job (job not NULL) is pinned to the versions its inputs name
--     (taskplat_input_pins); the caller resolved them and holds the datasets' share locks;
--   * each inserted Queued task gets exactly one `enqueue_task` row, in the same statement;
--   * NOTIFY, delivered on commit: `taskplat_outbox` (the relay, and the dispatchers' waiting
--     claims) for a wake-up due now, `taskplat_queued` (the waiting claims only) for a held one,
--     unless p_notify_held is false (the caller wakes its own waiting claim); payload: the queue;
--   * returns each inserted task's row and whether its wake-up was held, in the order given;
--   * a NULL config, inputs, max_processing_attempts or on_exhausted takes the column's default;
--   * time is coalesce(p_now, now()).

CREATE TYPE taskplat_new_task AS (
    task_id uuid,
    queue text,
    operator text,
    job jsonb,
    config jsonb,
    inputs jsonb,
    max_attempts integer,
    max_processing_attempts integer,
    on_exhausted text,
    backoff_base_seconds double precision,
    backoff_max_seconds double precision,
    timeout_seconds integer,
    scheduled_for timestamptz,
    expires_at timestamptz,
    idempotency_key text
);

COMMENT ON TYPE taskplat_new_task IS 'The values of a new task (taskplat_create_tasks).';

CREATE FUNCTION taskplat_create_tasks(
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
            updated_at, trace_context)
        SELECT n.task_id,
               CASE WHEN n.scheduled_for > v_now THEN 'Scheduled' ELSE 'Queued' END,
               n.queue, n.operator, n.job, coalesce(n.config, '{}'::jsonb),
               coalesce(n.inputs, '[]'::jsonb), n.max_attempts,
               coalesce(n.max_processing_attempts, 10), coalesce(n.on_exhausted, 'dead_letter'),
               n.backoff_base_seconds, n.backoff_max_seconds, n.timeout_seconds,
               n.scheduled_for, n.expires_at, n.idempotency_key,
               CASE WHEN n.scheduled_for > v_now THEN NULL ELSE v_now END,
               v_now, v_now, p_trace_context
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

COMMENT ON FUNCTION taskplat_create_tasks(taskplat_new_task[], timestamptz, jsonb,
                                          double precision, boolean) IS
    'Creates tasks: the rows, their pins, the wake-ups of the Queued ones and their NOTIFY.';

-- The wake-up function also names the task each row wakes, so a creator can tell which of its
-- tasks had theirs held.
DROP FUNCTION taskplat_enqueue_wakeups(uuid[], timestamptz, jsonb, double precision);

CREATE FUNCTION taskplat_enqueue_wakeups(
    p_task_ids uuid[],
    p_now timestamptz,
    p_trace_context jsonb DEFAULT NULL,
    p_hold_seconds double precision DEFAULT 0
) RETURNS TABLE (queue text, held boolean, task_id uuid)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (migration 0020)
AS $$
#variable_conflict use_column
BEGIN
    IF coalesce(cardinality(p_task_ids), 0) = 0 THEN
        RETURN;
    END IF;
    -- Guard: one `enqueue_task` row per named task that is Queued, in the order named. With
    -- p_hold_seconds > 0, the row of a task whose queue's workers wait on the dispatcher
    -- (`queues.polled_until` ahead, migration 0016) is written held, due p_hold_seconds later.
    RETURN QUERY
    WITH written AS (
    INSERT INTO outbox AS o (kind, task_id, queue, payload, trace_context, created_at,
                             available_at, held)
    SELECT 'enqueue_task', (x.task).task_id, (x.task).queue,
           jsonb_build_object('task_id', (x.task).task_id::text), p_trace_context, p_now,
           p_now + CASE WHEN q.name IS NOT NULL THEN make_interval(secs => p_hold_seconds)
                        ELSE interval '0' END,
           q.name IS NOT NULL
    FROM unnest(p_task_ids) WITH ORDINALITY AS i(task_id, position)
    -- By primary key only (OFFSET 0 keeps the status test out of the scan, so no partial index
    -- over Queued rows is ever read whole, whatever the statistics).
    CROSS JOIN LATERAL (SELECT t AS task FROM tasks AS t WHERE t.task_id = i.task_id OFFSET 0)
        AS x
    LEFT JOIN queues AS q
           ON q.name = (x.task).queue AND q.polled_until > p_now AND p_hold_seconds > 0
    WHERE (x.task).status = 'Queued'
    ORDER BY i.position
    RETURNING o.queue, o.held, o.task_id
    )
    SELECT w.queue, w.held, w.task_id FROM written AS w;
END
$$;

COMMENT ON FUNCTION taskplat_enqueue_wakeups(uuid[], timestamptz, jsonb, double precision) IS
    'The enqueue_task outbox row of each named Queued task (held for a polled queue).';

-- A job run: the job's values, created by taskplat_create_tasks (its wake-up held and its NOTIFY
-- sent as a create's). NULL: no such job, or the idempotency key is taken.
DROP FUNCTION taskplat_start_job_run(text, text, jsonb, jsonb, text, timestamptz, jsonb, uuid);

CREATE FUNCTION taskplat_start_job_run(
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
                       NULL, p_idempotency_key)::taskplat_new_task],
             p_now, p_trace_context, p_hold_seconds) AS c
    WHERE j.dag_name = p_dag_name AND j.name = p_job_name
$$;

COMMENT ON FUNCTION taskplat_start_job_run(text, text, jsonb, jsonb, text, timestamptz, jsonb,
                                           uuid, double precision) IS
    'Starts a run of a job: its task, created by taskplat_create_tasks.';

-- The cancel, one home: a cancel by request (the dispatcher's statement) and one by a dataset
-- version that stops being current (taskplat_make_version_current, migration 0017) wrote the same
-- transition and the closing of the open attempt record twice.
--
-- Invariants:
--   * guard: only a live task moves (Scheduled, Queued, Failed or Running); a Running one ends its
--     attempt with outcome Canceled (its lease holder's completion is then refused: the status
--     guard), and its open attempt record is closed with outcome Canceled in the same statement;
--   * no wake-up is written and no retry follows; finished_at and updated_at are now;
--   * rows are found by primary key only (the status test is kept out of the index choice, as
--     the claims do, migration 0020);
--   * returns the canceled tasks (with the attempt that was current), in task_id order.

CREATE FUNCTION taskplat_cancel_tasks(
    p_task_ids uuid[],
    p_reason text,
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (task_id uuid, attempt integer, queue text, operator text, worker_id text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (migration 0020)
AS $$
#variable_conflict use_column
DECLARE
    v_now constant timestamptz := coalesce(p_now, now());
BEGIN
    IF coalesce(cardinality(p_task_ids), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH canceled AS (
        UPDATE tasks AS t
        SET status = 'Canceled',
            cancel_reason = p_reason,
            attempt_outcome = CASE WHEN t.status = 'Running' THEN 'Canceled'
                                   ELSE t.attempt_outcome END,
            next_retry_at = NULL,
            lease_expires_at = NULL,
            finished_at = v_now,
            updated_at = v_now
        WHERE t.task_id = ANY (p_task_ids)
          AND (t.status IN ('Scheduled', 'Queued', 'Failed', 'Running')) IS TRUE
        RETURNING t.task_id, t.attempt, t.queue, t.operator, t.worker_id
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET outcome = 'Canceled', finished_at = v_now
        FROM canceled AS c
        WHERE a.task_id = c.task_id AND a.attempt = c.attempt AND a.outcome IS NULL
    )
    SELECT c.task_id, c.attempt, c.queue, c.operator, c.worker_id
    FROM canceled AS c
    ORDER BY c.task_id;
END
$$;

COMMENT ON FUNCTION taskplat_cancel_tasks(uuid[], text, timestamptz) IS
    'Cancels the named live tasks (Requested or VersionSuperseded), closing their open attempts.';

-- A version made current cancels the live tasks pinned to another version through the cancel.
CREATE OR REPLACE FUNCTION taskplat_make_version_current(
    p_dataset_uuid uuid, p_version uuid, p_how text, p_now timestamptz)
RETURNS TABLE (task_id uuid, attempt integer, queue text, operator text, worker_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE dataset_versions AS v
    SET superseded_at = p_now
    WHERE v.dataset_uuid = p_dataset_uuid AND v.superseded_at IS NULL
      AND v.dataset_version <> p_version;
    IF p_how = 'created' THEN
        INSERT INTO dataset_versions (dataset_uuid, dataset_version, created_at, current_since,
                                      became_current)
        VALUES (p_dataset_uuid, p_version, p_now, p_now, 'created');
    ELSE
        UPDATE dataset_versions AS v
        SET superseded_at = NULL, current_since = p_now, became_current = 'rollback'
        WHERE v.dataset_uuid = p_dataset_uuid AND v.dataset_version = p_version;
        UPDATE datasets AS d
        SET location = 'postgres_table:' || t.table_name
        FROM dataset_tables AS t
        WHERE d.dataset_uuid = p_dataset_uuid
          AND t.dataset_uuid = p_dataset_uuid AND t.dataset_version = p_version;
    END IF;
    UPDATE datasets AS d
    SET current_version = p_version, updated_at = p_now
    WHERE d.dataset_uuid = p_dataset_uuid;
    RETURN QUERY
    SELECT c.task_id, c.attempt, c.queue, c.operator, c.worker_id
    FROM taskplat_cancel_tasks(
        ARRAY(SELECT p.task_id FROM task_pins AS p
              WHERE p.dataset_uuid = p_dataset_uuid AND p.dataset_version <> p_version),
        'VersionSuperseded', p_now) AS c;
END
$$;

-- What an accepted success carries, one home: the completion (taskplat_end_attempts) and a late
-- success (taskplat_complete_late, whose events, outputs and attempt record the dispatcher wrote
-- with statements of its own) store an attempt's events and outputs through
-- taskplat_store_results.
--
-- Invariants:
--   * events are stored for every element (a retry's events stay), each once (the event key);
--   * outputs only for a Completed element, replacing those of an earlier completion of the
--     same task (a replayed task), all stamped p_at;
--   * a late success closes the attempt record the timeout closed: outcome Completed, its
--     completion digest, no error, finished at the success.

CREATE FUNCTION taskplat_store_results(
    p_task_ids uuid[],
    p_attempts integer[],
    p_completed boolean[],
    p_events jsonb[],
    p_outputs jsonb[],
    p_at timestamptz
) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (migration 0020)
AS $$
BEGIN
    IF coalesce(cardinality(p_task_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
        partition_key, range_start, range_end, created_at)
    SELECT c.task_id, c.attempt, e.dataset_uuid, e.dataset_version, e.cursor,
        e.partition_key, e.start, e.end, p_at
    FROM unnest(p_task_ids, p_attempts, p_events) AS c(task_id, attempt, events),
         jsonb_to_recordset(c.events) AS e(
             dataset_uuid uuid, dataset_version uuid, "cursor" bigint, partition_key text,
             "start" bigint, "end" bigint)
    ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING;
    INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
        location, "cursor", row_count, committed_at)
    SELECT c.task_id, x.output_index, c.attempt, x.dataset_uuid, x.dataset_version,
        x.location, x.cursor, x.row_count, p_at
    FROM unnest(p_task_ids, p_attempts, p_completed, p_outputs)
             AS c(task_id, attempt, completed, outputs),
         jsonb_to_recordset(c.outputs) AS x(
             output_index integer, dataset_uuid uuid, dataset_version uuid, location text,
             "cursor" bigint, row_count bigint)
    WHERE c.completed
    ON CONFLICT (task_id, output_index) DO UPDATE
    SET (attempt, dataset_uuid, dataset_version, location, "cursor", row_count, committed_at) =
        (EXCLUDED.attempt, EXCLUDED.dataset_uuid, EXCLUDED.dataset_version, EXCLUDED.location,
         EXCLUDED."cursor", EXCLUDED.row_count, EXCLUDED.committed_at);
    RETURN cardinality(p_task_ids);
END
$$;

COMMENT ON FUNCTION taskplat_store_results(uuid[], integer[], boolean[], jsonb[], jsonb[],
                                          timestamptz) IS
    'Stores the events (and, Completed, the outputs) of accepted attempt ends.';

CREATE OR REPLACE FUNCTION taskplat_end_attempts(
    p_task_ids uuid[],
    p_attempts integer[],
    p_lease_tokens uuid[],
    p_ended text[],
    p_retryables boolean[],
    p_results jsonb[],
    p_errors text[],
    p_retry_afters double precision[],
    p_jitters double precision[],
    p_digests text[],
    p_events jsonb[],
    p_outputs jsonb[],
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (
    task_id uuid, status text, queue text, operator text, attempt integer, max_attempts integer,
    worker_id text, started_at timestamptz, dead_reason text, last_error text,
    next_retry_at timestamptz, finished_at timestamptz, ended_at timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see migration 0020)
AS $$
#variable_conflict use_column
BEGIN
    -- The end itself is taskplat_end_running's (guard, fate, attempt record); what each element
    -- that moved carries is taskplat_store_results'. p_ended: Completed, Failed or Drained.
    -- Elements name distinct tasks.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT e.* FROM taskplat_end_running(p_task_ids, p_attempts, p_lease_tokens, p_ended,
            p_retryables, p_results, p_errors, p_retry_afters, p_jitters, p_digests, p_now) AS e
    ),
    stored AS MATERIALIZED (
        SELECT taskplat_store_results(array_agg(d.task_id), array_agg(d.attempt),
                                      array_agg(d.status = 'Completed'), array_agg(c.events),
                                      array_agg(c.outputs), max(d.ended_at)) AS elements
        FROM done AS d
        JOIN unnest(p_task_ids, p_events, p_outputs) AS c(task_id, events, outputs)
          ON c.task_id = d.task_id
    )
    SELECT d.task_id, d.status, d.queue, d.operator, d.attempt, d.max_attempts, d.worker_id,
           d.started_at, d.dead_reason, d.last_error, d.next_retry_at, d.finished_at, d.ended_at
    FROM done AS d CROSS JOIN stored
    ORDER BY d.task_id;
END
$$;

DROP FUNCTION taskplat_complete_late(uuid, integer, uuid, jsonb, jsonb, timestamptz);

CREATE FUNCTION taskplat_complete_late(
    p_task_id uuid,
    p_attempt integer,
    p_lease_token uuid,
    p_result jsonb,
    p_trace_context jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT NULL,
    p_digest text DEFAULT NULL,
    p_events jsonb DEFAULT '[]'::jsonb,
    p_outputs jsonb DEFAULT '[]'::jsonb
) RETURNS TABLE (
    task_id uuid, status text, queue text, operator text, attempt integer, max_attempts integer,
    worker_id text, started_at timestamptz, dead_reason text, next_retry_at timestamptz,
    ended_at timestamptz, notified bigint
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see migration 0020)
AS $$
#variable_conflict use_column
BEGIN
    -- A late success of the current attempt after its lease or deadline ran out: accepted while
    -- no newer attempt started (attempt and lease token unchanged) and the task was not
    -- canceled (Failed or Dead of LeaseExpired / DeadlineExceeded). Its attempt record is closed
    -- again as Completed, its events and outputs stored (taskplat_store_results). A task that
    -- had died of the timeout was dead-lettered (unless it discards): a `resolved` record follows
    -- the first one, and the relay is notified. The caller holds the row lock, so `old` is the
    -- row this updates.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    old AS MATERIALIZED (  -- read by primary key, whatever the later filter on status
        SELECT t.task_id, t.status, t AS task FROM tasks AS t WHERE t.task_id = p_task_id
    ),
    done AS MATERIALIZED (
        UPDATE tasks AS t
        SET status = 'Completed',
            attempt_outcome = 'Completed',
            result = p_result,
            dead_reason = NULL,
            next_retry_at = NULL,
            finished_at = n.now,
            updated_at = n.now
        FROM n
        WHERE t.task_id = p_task_id
          AND t.status IN ('Failed', 'Dead')
          AND t.attempt_outcome IN ('LeaseExpired', 'DeadlineExceeded')
          AND t.attempt = p_attempt
          AND t.lease_token = p_lease_token
        RETURNING t.task_id, t.status, t.queue, t.operator, t.attempt, t.max_attempts,
                  t.worker_id, t.started_at, t.dead_reason, t.next_retry_at, n.now AS ended_at
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET finished_at = d.ended_at, outcome = 'Completed', error = NULL,
            completion_digest = p_digest
        FROM done AS d
        WHERE a.task_id = d.task_id AND a.attempt = d.attempt AND a.lease_token = p_lease_token
    ),
    stored AS MATERIALIZED (
        SELECT taskplat_store_results(ARRAY[d.task_id], ARRAY[d.attempt], ARRAY[true],
                                      ARRAY[p_events], ARRAY[p_outputs], d.ended_at) AS elements
        FROM done AS d
    ),
    resolved AS (  -- the first record (taskplat_dead_letter_payload), marked resolved
        INSERT INTO outbox (kind, task_id, queue, payload, trace_context, created_at,
                            available_at)
        SELECT 'dead_letter', d.task_id, d.queue,
               taskplat_dead_letter_payload(o.task)
                   || jsonb_build_object('record', 'resolved', 'resolved_at', d.ended_at),
               p_trace_context, d.ended_at, d.ended_at
        FROM done AS d JOIN old AS o ON o.task_id = d.task_id
        WHERE o.status = 'Dead' AND taskplat_dead_letter_wanted(d.task_id)
        RETURNING outbox.queue
    ),
    notified AS (SELECT pg_notify('taskplat_outbox', r.queue) FROM resolved AS r)
    SELECT d.task_id, d.status, d.queue, d.operator, d.attempt, d.max_attempts, d.worker_id,
           d.started_at, d.dead_reason, d.next_retry_at, d.ended_at,
           (SELECT count(*) FROM notified)
    FROM done AS d LEFT JOIN stored ON true;
END
$$;

COMMENT ON FUNCTION taskplat_complete_late(uuid, integer, uuid, jsonb, jsonb, timestamptz, text,
                                           jsonb, jsonb) IS
    'Completes an attempt whose late success arrived after its timeout (same attempt and lease).';

-- The dead-letter record formats a timestamptz (its text depends on the session's TimeZone):
-- STABLE, not IMMUTABLE.
ALTER FUNCTION taskplat_dead_letter_payload(tasks) STABLE;

-- The fence of a write made while an attempt runs (its events, its steps), one home: the task of
-- the named attempt, share-locked while it is Running that attempt under the named lease token
-- (any lease when the token is NULL: a call authenticated by the worker token alone), so a
-- cancel or an end waits for the write's commit. No row: the guard did not match.
CREATE FUNCTION taskplat_share_fence(p_task_id uuid, p_attempt integer, p_lease_token uuid)
RETURNS TABLE (task_id uuid)
LANGUAGE sql AS $$  -- volatile: it takes a row lock
    SELECT t.task_id
    FROM tasks AS t
    WHERE t.task_id = p_task_id
      AND t.status = 'Running'
      AND t.attempt = p_attempt
      AND (p_lease_token IS NULL OR t.lease_token = p_lease_token)
    FOR SHARE
$$;

COMMENT ON FUNCTION taskplat_share_fence(uuid, integer, uuid) IS
    'The task of the named Running attempt (and lease), share-locked for a write made meanwhile.';
