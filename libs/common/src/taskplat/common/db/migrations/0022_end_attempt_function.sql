-- The end of an attempt, one home: what a Running task's row and its attempt record become when
-- the attempt ends, whoever ends it.
--
-- Until now the columns set when an attempt ends (status, outcome, result, error, dead reason,
-- processing attempts, retry time, finish time, lease expiry) were written twice, once in the
-- completion (taskplat_end_attempts) and once in the timeouts (taskplat_reap_timeouts), each with
-- its own copy of the guard and of the attempt record's closing. Now both call
-- taskplat_end_running, which holds that list once; the completion adds its events and outputs,
-- the timeouts their selection (SKIP LOCKED, earliest first) and the dead-letter records.
--
-- Invariants:
--   * guard (fencing): an element moves its task only while the task is Running the named
--     attempt under the named lease token; the rows are locked in task_id order (concurrent
--     calls over overlapping tasks wait for each other, never deadlock). Elements name distinct
--     tasks;
--   * the task's fate is the rule every ended attempt follows (migration 0008:
--     taskplat_ended_status, taskplat_dead_reason, taskplat_retry_at): Completed, Failed with a
--     retry at now + backoff (or the holder's retry_after), or Dead; an infrastructure end
--     (LeaseExpired, Drained) counts in processing_attempts, not against max_attempts;
--   * a Completed attempt keeps the task's last error and stores its result; any other end keeps
--     the result and stores its error, on the task and on the attempt record;
--   * the lease token stays on the row (a late success of this attempt can still be
--     recognised), its expiry is cleared; finished_at is set unless a retry follows;
--   * the attempt record (still open) is closed in the same statement, with the outcome, the
--     completion digest and, unless Completed, the error;
--   * the timeouts select their rows with FOR UPDATE SKIP LOCKED in a first statement and keep
--     those locks until their transaction ends, so a row the selection took cannot change before
--     it is moved: the re-checked guard (status, attempt, lease token) then always holds;
--   * time is coalesce(p_now, now()).

CREATE FUNCTION taskplat_end_running(
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
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (
    task_id uuid, attempt integer, status text, queue text, operator text, max_attempts integer,
    worker_id text, started_at timestamptz, dead_reason text, last_error text,
    next_retry_at timestamptz, finished_at timestamptz, ended_at timestamptz, ended text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see migration 0020)
AS $$
#variable_conflict use_column
BEGIN
    -- p_ended: how each attempt ended (Completed, Failed, Drained from its holder; LeaseExpired,
    -- DeadlineExceeded from the timeouts). Returns the moved tasks in task_id order.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    c AS (
        SELECT * FROM unnest(p_task_ids, p_attempts, p_lease_tokens, p_ended, p_retryables,
                             p_results, p_errors, p_retry_afters, p_jitters, p_digests)
            AS c(task_id, attempt, lease_token, ended, retryable, result, error, retry_after,
                 jitter, digest)
    ),
    locked AS MATERIALIZED (
        SELECT t.task_id FROM tasks AS t JOIN c ON c.task_id = t.task_id
        WHERE t.status = 'Running' AND t.attempt = c.attempt AND t.lease_token = c.lease_token
        ORDER BY t.task_id
        FOR UPDATE OF t
    ),
    done AS (
        UPDATE tasks AS t
        SET status = taskplat_ended_status(t, c.ended, c.retryable),
            attempt_outcome = c.ended,
            result = CASE WHEN c.ended = 'Completed' THEN c.result ELSE t.result END,
            last_error = CASE WHEN c.ended = 'Completed' THEN t.last_error ELSE c.error END,
            dead_reason = taskplat_dead_reason(t, c.ended, c.retryable),
            processing_attempts = t.processing_attempts
                + (c.ended IN ('LeaseExpired', 'Drained'))::int,
            next_retry_at = taskplat_retry_at(t, c.ended, c.retryable, n.now, c.retry_after,
                c.jitter),
            finished_at = CASE WHEN taskplat_ended_status(t, c.ended, c.retryable) = 'Failed'
                THEN NULL ELSE n.now END,
            lease_expires_at = NULL,
            updated_at = n.now
        FROM n, c, locked AS l
        WHERE t.task_id = c.task_id AND l.task_id = t.task_id AND t.status = 'Running'
          AND t.attempt = c.attempt AND t.lease_token = c.lease_token
        RETURNING t.task_id, t.attempt, t.status, t.queue, t.operator, t.max_attempts,
            t.worker_id, t.started_at, t.dead_reason, t.last_error, t.next_retry_at,
            t.finished_at, n.now AS ended_at, c.ended, c.error, c.digest, c.lease_token
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET finished_at = d.ended_at, outcome = d.ended, completion_digest = d.digest,
            error = CASE WHEN d.ended <> 'Completed' THEN d.error END
        FROM done AS d
        WHERE a.task_id = d.task_id AND a.attempt = d.attempt AND a.lease_token = d.lease_token
          AND a.outcome IS NULL
    )
    SELECT d.task_id, d.attempt, d.status, d.queue, d.operator, d.max_attempts, d.worker_id,
           d.started_at, d.dead_reason, d.last_error, d.next_retry_at, d.finished_at,
           d.ended_at, d.ended
    FROM done AS d
    ORDER BY d.task_id;
END
$$;

COMMENT ON FUNCTION taskplat_end_running(uuid[], integer[], uuid[], text[], boolean[], jsonb[],
                                         text[], double precision[], double precision[], text[],
                                         timestamptz) IS
    'Ends the named Running attempts (fenced by attempt and lease): the columns every end sets.';

-- The completion: the attempts their holders report, with their events and outputs.
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
    -- The end itself is taskplat_end_running's (guard, fate, attempt record). For each element
    -- that moved, in this statement: its events stored and, for Completed, its outputs
    -- (replacing those of an earlier completion of a replayed task). p_ended: Completed, Failed
    -- or Drained. Elements name distinct tasks.
    RETURN QUERY
    WITH done AS MATERIALIZED (
        SELECT e.* FROM taskplat_end_running(p_task_ids, p_attempts, p_lease_tokens, p_ended,
            p_retryables, p_results, p_errors, p_retry_afters, p_jitters, p_digests, p_now) AS e
    ),
    c AS (
        SELECT * FROM unnest(p_task_ids, p_events, p_outputs) AS c(task_id, events, outputs)
    ),
    events AS (
        INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
            partition_key, range_start, range_end, created_at)
        SELECT d.task_id, d.attempt, e.dataset_uuid, e.dataset_version, e.cursor,
            e.partition_key, e.start, e.end, d.ended_at
        FROM done AS d JOIN c ON c.task_id = d.task_id, jsonb_to_recordset(c.events) AS e(
            dataset_uuid uuid, dataset_version uuid, "cursor" bigint, partition_key text,
            "start" bigint, "end" bigint)
        ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
    ),
    outputs AS (
        INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
            location, "cursor", row_count, committed_at)
        SELECT d.task_id, x.output_index, d.attempt, x.dataset_uuid, x.dataset_version,
            x.location, x.cursor, x.row_count, d.ended_at
        FROM done AS d JOIN c ON c.task_id = d.task_id, jsonb_to_recordset(c.outputs) AS x(
            output_index integer, dataset_uuid uuid, dataset_version uuid, location text,
            "cursor" bigint, row_count bigint)
        WHERE d.status = 'Completed'
        ON CONFLICT (task_id, output_index) DO UPDATE
        SET (attempt, dataset_uuid, dataset_version, location, "cursor", row_count,
             committed_at) =
            (EXCLUDED.attempt, EXCLUDED.dataset_uuid, EXCLUDED.dataset_version,
             EXCLUDED.location, EXCLUDED."cursor", EXCLUDED.row_count, EXCLUDED.committed_at)
    )
    SELECT d.task_id, d.status, d.queue, d.operator, d.attempt, d.max_attempts, d.worker_id,
           d.started_at, d.dead_reason, d.last_error, d.next_retry_at, d.finished_at, d.ended_at
    FROM done AS d
    ORDER BY d.task_id;
END
$$;

-- The timeouts: Running attempts whose lease ran out or whose deadline + grace passed.
CREATE OR REPLACE FUNCTION taskplat_reap_timeouts(
    p_now timestamptz,
    p_grace_seconds double precision,
    p_limit integer,
    p_jitters double precision[]
) RETURNS TABLE (
    task_id uuid, attempt integer, status text, queue text, operator text, worker_id text,
    dead_reason text, next_retry_at timestamptz, ended text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see migration 0020)
AS $$
#variable_conflict use_column
DECLARE
    v_now constant timestamptz := coalesce(p_now, now());
    v_overrun constant timestamptz := v_now - make_interval(secs => p_grace_seconds);
    v_ids uuid[];
    v_attempts integer[];
    v_tokens uuid[];
    v_ended text[];
    v_count integer;
BEGIN
    -- Running attempts that timed out, at most p_limit, earliest first: the lease ran out
    -- (LeaseExpired: the worker vanished, not the task's fault), or deadline_at + grace passed
    -- even while heartbeats kept the lease fresh (DeadlineExceeded); both: LeaseExpired.
    -- Guard: rows held by a completion or heartbeat are skipped (SKIP LOCKED); a row one of them
    -- committed after this statement's snapshot is re-tested on its newest version when the
    -- lock is taken, and left out when it no longer timed out. The locks are kept until the
    -- transaction ends, so the rows cannot change before taskplat_end_running moves them.
    SELECT array_agg(d.task_id ORDER BY d.due_at, d.task_id),
           array_agg(d.attempt ORDER BY d.due_at, d.task_id),
           array_agg(d.lease_token ORDER BY d.due_at, d.task_id),
           array_agg(d.ended ORDER BY d.due_at, d.task_id)
    INTO v_ids, v_attempts, v_tokens, v_ended
    FROM (
        SELECT t.task_id, t.attempt, t.lease_token,
               least(t.lease_expires_at, t.deadline_at) AS due_at,
               CASE WHEN t.lease_expires_at < v_now THEN 'LeaseExpired'
                    ELSE 'DeadlineExceeded' END AS ended
        FROM tasks AS t
        WHERE t.status = 'Running'
          AND (t.lease_expires_at < v_now OR t.deadline_at < v_overrun)
        ORDER BY least(t.lease_expires_at, t.deadline_at)
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    ) AS d;
    v_count := coalesce(cardinality(v_ids), 0);
    IF v_count = 0 THEN
        RETURN;
    END IF;
    -- The end is taskplat_end_running's: retryable, the error named after the timeout, no
    -- retry_after, p_jitters[i] (else 1.0) for the i-th row, earliest first. A task that became
    -- Dead gets its dead-letter record.
    RETURN QUERY
    WITH moved AS MATERIALIZED (
        SELECT e.* FROM taskplat_end_running(
            v_ids, v_attempts, v_tokens, v_ended,
            array_fill(true, ARRAY[v_count]),
            array_fill(NULL::jsonb, ARRAY[v_count]),
            ARRAY(SELECT CASE x.ended WHEN 'LeaseExpired' THEN 'lease expired'
                                      ELSE 'deadline exceeded' END
                  FROM unnest(v_ended) WITH ORDINALITY AS x(ended, i) ORDER BY x.i),
            array_fill(NULL::double precision, ARRAY[v_count]),
            ARRAY(SELECT coalesce(p_jitters[i], 1.0) FROM generate_series(1, v_count) AS i
                  ORDER BY i),
            array_fill(NULL::text, ARRAY[v_count]),
            v_now) AS e
    ),
    dead AS (
        SELECT count(*) AS written
        FROM taskplat_dead_letter(
            ARRAY(SELECT m.task_id FROM moved AS m WHERE m.status = 'Dead'), v_now)
    )
    SELECT m.task_id, m.attempt, m.status, m.queue, m.operator, m.worker_id, m.dead_reason,
           m.next_retry_at, m.ended
    FROM moved AS m, dead;  -- dead: one row, read so that it runs
END
$$;

-- The heartbeat and the late success, one home each: the dispatcher's statements call them, and
-- so do the tests of the loops that race them (the reaper, the scheduler), instead of copies.

CREATE FUNCTION taskplat_heartbeat(
    p_task_id uuid,
    p_attempt integer,
    p_lease_token uuid,
    p_lease_seconds double precision,
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (lease_expires_at timestamptz, queue text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see migration 0020)
AS $$
#variable_conflict use_column
BEGIN
    -- Guard (fencing): only while the task is Running the named attempt under the named lease
    -- token; the lease then runs p_lease_seconds from now. Nothing else of the row changes.
    RETURN QUERY
    UPDATE tasks AS t
    SET lease_expires_at = n.now + make_interval(secs => p_lease_seconds),
        updated_at = n.now
    FROM (SELECT coalesce(p_now, now()) AS now) AS n
    WHERE t.task_id = p_task_id
      AND t.status = 'Running'
      AND t.attempt = p_attempt
      AND t.lease_token = p_lease_token
    RETURNING t.lease_expires_at, t.queue;
END
$$;

COMMENT ON FUNCTION taskplat_heartbeat(uuid, integer, uuid, double precision, timestamptz) IS
    'Extends the lease of the named Running attempt (fenced by attempt and lease).';

CREATE FUNCTION taskplat_complete_late(
    p_task_id uuid,
    p_attempt integer,
    p_lease_token uuid,
    p_result jsonb,
    p_trace_context jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT NULL
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
    -- canceled (Failed or Dead of LeaseExpired / DeadlineExceeded). A task that had died of the
    -- timeout was dead-lettered (unless it discards): a `resolved` record follows the first one,
    -- and the relay is notified. The caller holds the row lock, so `old` is the row this updates.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    old AS MATERIALIZED (  -- read by primary key, whatever the later filter on status
        SELECT t.task_id, t.status, t AS task FROM tasks AS t WHERE t.task_id = p_task_id
    ),
    done AS (
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
    FROM done AS d;
END
$$;

COMMENT ON FUNCTION taskplat_complete_late(uuid, integer, uuid, jsonb, jsonb, timestamptz) IS
    'Completes an attempt whose late success arrived after its timeout (same attempt and lease).';

-- Datasets and their tables, one home each: the dispatcher's DAG apply and version rollovers
-- call these, and so do the tests that need a dataset as the platform stores it.
--
-- Invariants:
--   * a dataset is created with its first version, current at once, in one statement; a name
--     that exists already creates nothing (the caller reads the existing row);
--   * a buffered dataset's table is named `dataset_<uuid>` for its first table and
--     `dataset_<uuid>_v<n>` for the n-th; it is created through taskplat_create_dataset_table
--     (the allow-list, the owner's rights), recorded for the version, named by the dataset's
--     location, and the dataset has its buffer row (and the task its sink events are stored
--     under); the caller holds the dataset row's lock;
--   * time is coalesce(p_now, now()).

CREATE FUNCTION taskplat_create_dataset(
    p_name text,
    p_kind text,
    p_location text,
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (dataset_uuid uuid, current_version uuid)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    created AS (
        INSERT INTO datasets AS d (dataset_uuid, name, kind, location, current_version,
                                   created_at, updated_at)
        SELECT gen_random_uuid(), p_name, p_kind, p_location, gen_random_uuid(), n.now, n.now
        FROM n
        ON CONFLICT (name) DO NOTHING
        RETURNING d.dataset_uuid, d.current_version, d.created_at
    ),
    first_version AS (
        INSERT INTO dataset_versions (dataset_uuid, dataset_version, created_at, current_since,
                                      became_current)
        SELECT c.dataset_uuid, c.current_version, c.created_at, c.created_at, 'created'
        FROM created AS c
    )
    SELECT c.dataset_uuid, c.current_version FROM created AS c;
END
$$;

COMMENT ON FUNCTION taskplat_create_dataset(text, text, text, timestamptz) IS
    'Creates a dataset with its first (current) version; nothing when the name exists.';

CREATE FUNCTION taskplat_add_dataset_table(
    p_dataset_uuid uuid,
    p_dataset_version uuid,
    p_columns jsonb,
    p_schema_hash text,
    p_now timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_now constant timestamptz := coalesce(p_now, now());
    v_ordinal integer;
    v_table text;
BEGIN
    SELECT coalesce(max(t.ordinal), 0) + 1 INTO v_ordinal
    FROM dataset_tables AS t WHERE t.dataset_uuid = p_dataset_uuid;
    v_table := 'dataset_' || p_dataset_uuid::text
        || CASE WHEN v_ordinal = 1 THEN '' ELSE '_v' || v_ordinal::text END;
    PERFORM taskplat_create_dataset_table(v_table, p_columns);
    INSERT INTO dataset_tables (dataset_uuid, dataset_version, ordinal, table_name, columns,
                                schema_hash, created_at)
    VALUES (p_dataset_uuid, p_dataset_version, v_ordinal, v_table, p_columns, p_schema_hash,
            v_now);
    UPDATE datasets AS d
    SET location = 'postgres_table:' || v_table, updated_at = v_now
    WHERE d.dataset_uuid = p_dataset_uuid;
    -- The buffer row and the task its sink events are stored under (Completed, never finished:
    -- retention keeps it). Nothing when the buffer exists.
    WITH fresh AS (
        SELECT gen_random_uuid() AS task_id
        WHERE NOT EXISTS (SELECT 1 FROM dataset_buffers AS b
                          WHERE b.dataset_uuid = p_dataset_uuid)
    ),
    task AS (
        INSERT INTO tasks AS t (task_id, status, queue, operator, config, max_attempts,
                                backoff_base_seconds, backoff_max_seconds, attempt_outcome,
                                created_at, updated_at)
        SELECT f.task_id, 'Completed', 'default', 'taskplat.sink',
               jsonb_build_object('dataset_uuid', p_dataset_uuid::text), 1, 0, 0, 'Completed',
               v_now, v_now
        FROM fresh AS f
        RETURNING t.task_id
    )
    INSERT INTO dataset_buffers (dataset_uuid, producer_task_id, created_at)
    SELECT p_dataset_uuid, k.task_id, v_now FROM task AS k;
    RETURN v_table;
END
$$;

COMMENT ON FUNCTION taskplat_add_dataset_table(uuid, uuid, jsonb, text, timestamptz) IS
    'Creates and records the table of a buffered dataset''s version; the dataset''s location names it.';
