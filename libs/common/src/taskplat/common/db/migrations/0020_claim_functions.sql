-- The claim, one home: every claim of every service is a call of these functions.
--
-- Until now the Queued -> Running transition was written four times (the dispatcher's single,
-- batch and claim-next statements, and the relay's claim for a Lambda function), each with its own
-- copy of the guards. Now:
--   * taskplat_start_attempts(ids, ...): the transition itself, for rows the caller has locked as
--     claimable: a fresh lease, the attempt's deadline, the worker, and the attempt record;
--   * taskplat_claim(ids, ...): claims the named tasks that are claimable, locking them in
--     task_id order (concurrent claims of overlapping ids wait for each other, never deadlock);
--   * taskplat_claim_next(queue, max, ...): claims up to `max` claimable tasks of one queue that
--     no one else is claiming (SKIP LOCKED), oldest first, never a task of a `runtime: lambda` job.
--
-- Invariants:
--   * claimable = Queued, not past expires_at, and its queue not paused: the UPDATE of
--     taskplat_start_attempts tests it, on the newest version of each row it locks. Several
--     named rows are first locked in task_id order (FOR UPDATE re-tests the same guard), the
--     next-N rows with SKIP LOCKED;
--   * every started attempt gets its task_attempts row in the same statement;
--   * a claim for a Lambda function (p_function_prefix given) differs only in its times and
--     worker: the worker is 'lambda:' || prefix || operator and the first lease is the attempt's
--     timeout plus p_grace_seconds (the function cannot heartbeat before it starts);
--   * the returned row is what a claim answers (the columns of the claim payload);
--   * time is coalesce(p_now, now()).
--
-- Plan shape (these are the hottest statements): the moving UPDATE finds its rows by primary key
-- only (`= ANY(ids)`), never by the Queued partial index, which statistics taken while the queue
-- was empty make look cheap (under a backlog it read 4,120 entries to update 4 rows): it and the
-- lock of named ids test `(status = 'Queued') IS TRUE`, the same test in a form the planner does
-- not use to pick that index. A single claim is one UPDATE (the lock step would add a statement
-- to the hottest path). Every function here plans its statements once per session
-- (`plan_cache_mode = force_generic_plan`): with arrays for parameters, Postgres' plan cache would
-- otherwise keep choosing a custom plan, planning each statement again on every call (measured
-- on a single claim: +0.29 ms over the former statement, +0.11 ms with generic plans; the generic
-- plans are the ones tests/schema/test_hot_plans.py checks). PL/pgSQL keeps each statement's plan for the session
-- (tests/schema/test_hot_plans.py checks the plans inside these functions too).

CREATE FUNCTION taskplat_start_attempts(
    p_task_ids uuid[],
    p_now timestamptz,
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_lease_token uuid DEFAULT NULL,
    p_function_prefix text DEFAULT NULL,
    p_grace_seconds double precision DEFAULT 0
) RETURNS TABLE (
    task_id uuid, attempt integer, job jsonb, operator text, queue text, config jsonb,
    inputs jsonb, timeout_seconds integer, deadline_at timestamptz, lease_token uuid,
    lease_expires_at timestamptz, worker_id text, started_at timestamptz, queued_at timestamptz,
    created_at timestamptz, replay_offset integer, outputs jsonb, trust text, steps jsonb,
    trace_context jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Guard: only the named rows still claimable move (Queued, unexpired, queue not paused);
    -- the UPDATE re-tests it on the newest version of each row it locks, so one claim wins.
    -- p_lease_token: the lease of a single claimed task (a fresh one per task when NULL).
    RETURN QUERY
    WITH claimed AS (
        UPDATE tasks AS t
        SET status = 'Running',
            lease_token = coalesce(p_lease_token, gen_random_uuid()),
            lease_expires_at = p_now + make_interval(secs => CASE
                WHEN p_function_prefix IS NULL THEN p_lease_seconds
                ELSE coalesce(t.timeout_seconds, p_default_timeout_seconds) + p_grace_seconds
            END),
            deadline_at = p_now + make_interval(
                secs => coalesce(t.timeout_seconds, p_default_timeout_seconds)),
            worker_id = CASE WHEN p_function_prefix IS NULL THEN p_worker_id
                             ELSE 'lambda:' || p_function_prefix || t.operator END,
            started_at = p_now,
            attempt_outcome = NULL,
            next_retry_at = NULL,
            updated_at = p_now
        WHERE t.task_id = ANY(p_task_ids)
          AND (t.status = 'Queued') IS TRUE  -- by primary key, never the Queued index (top)
          AND (t.expires_at IS NULL OR t.expires_at > p_now)
          AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused)
        RETURNING t.task_id, t.attempt, t.job, t.operator, t.queue, t.config, t.inputs,
                  t.timeout_seconds, t.deadline_at, t.lease_token, t.lease_expires_at,
                  t.worker_id, t.started_at, t.queued_at, t.created_at, t.replay_offset,
                  taskplat_job_outputs(t.job) AS outputs, taskplat_job_trust(t.job) AS trust,
                  taskplat_task_steps(t.task_id, t.attempt) AS steps, t.trace_context
    ),
    history AS (
        INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at)
        SELECT c.task_id, c.attempt, c.worker_id, c.lease_token, c.started_at FROM claimed AS c
    )
    SELECT c.task_id, c.attempt, c.job, c.operator, c.queue, c.config, c.inputs,
           c.timeout_seconds, c.deadline_at, c.lease_token, c.lease_expires_at, c.worker_id,
           c.started_at, c.queued_at, c.created_at, c.replay_offset, c.outputs, c.trust,
           c.steps, c.trace_context
    FROM claimed AS c;
END
$$;

COMMENT ON FUNCTION taskplat_start_attempts(uuid[], timestamptz, text, double precision, integer,
                                            uuid, text, double precision) IS
    'Queued -> Running of rows the caller locked as claimable, with their attempt records.';

CREATE FUNCTION taskplat_claim(
    p_task_ids uuid[],
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_now timestamptz DEFAULT NULL,
    p_lease_token uuid DEFAULT NULL,
    p_function_prefix text DEFAULT NULL,
    p_grace_seconds double precision DEFAULT 0
) RETURNS TABLE (
    task_id uuid, attempt integer, job jsonb, operator text, queue text, config jsonb,
    inputs jsonb, timeout_seconds integer, deadline_at timestamptz, lease_token uuid,
    lease_expires_at timestamptz, worker_id text, started_at timestamptz, queued_at timestamptz,
    created_at timestamptz, replay_offset integer, outputs jsonb, trust text, steps jsonb,
    trace_context jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_locked uuid[];
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused; taskplat_start_attempts tests it).
    -- Several tasks are locked in task_id order first; one is locked by its UPDATE alone.
    IF cardinality(p_task_ids) = 1 THEN
        RETURN QUERY
        SELECT * FROM taskplat_start_attempts(p_task_ids, v_now, p_worker_id, p_lease_seconds,
                                              p_default_timeout_seconds, p_lease_token,
                                              p_function_prefix, p_grace_seconds);
        RETURN;
    END IF;
    v_locked := ARRAY(
        SELECT t.task_id
        FROM tasks AS t
        WHERE t.task_id = ANY(p_task_ids)
          AND (t.status = 'Queued') IS TRUE  -- by primary key, never the Queued index (see top)
          AND (t.expires_at IS NULL OR t.expires_at > v_now)
          AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused)
        ORDER BY t.task_id
        FOR UPDATE OF t);
    IF cardinality(v_locked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT * FROM taskplat_start_attempts(v_locked, v_now, p_worker_id, p_lease_seconds,
                                          p_default_timeout_seconds, p_lease_token,
                                          p_function_prefix, p_grace_seconds);
END
$$;

COMMENT ON FUNCTION taskplat_claim(uuid[], text, double precision, integer, timestamptz, uuid, text,
                                   double precision) IS
    'Claims the named tasks that are Queued, unexpired and of an unpaused queue (task_id order).';

CREATE FUNCTION taskplat_claim_next(
    p_queue text,
    p_max integer,
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_now timestamptz DEFAULT NULL
) RETURNS TABLE (
    task_id uuid, attempt integer, job jsonb, operator text, queue text, config jsonb,
    inputs jsonb, timeout_seconds integer, deadline_at timestamptz, lease_token uuid,
    lease_expires_at timestamptz, worker_id text, started_at timestamptz, queued_at timestamptz,
    created_at timestamptz, replay_offset integer, outputs jsonb, trust text, steps jsonb,
    trace_context jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_picked uuid[];
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused) and not a `runtime: lambda` job's
    -- task (the relay claims those for their function); rows others are claiming are skipped.
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
        ORDER BY t.queued_at
        LIMIT p_max
        FOR UPDATE OF t SKIP LOCKED);
    IF cardinality(v_picked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.* FROM taskplat_start_attempts(v_picked, v_now, p_worker_id, p_lease_seconds,
                                            p_default_timeout_seconds) AS s
    ORDER BY s.queued_at, s.task_id;
END
$$;

COMMENT ON FUNCTION taskplat_claim_next(text, integer, text, double precision, integer,
                                        timestamptz) IS
    'Claims up to p_max claimable tasks of a queue, oldest first, skipping locked rows and '
    'the tasks of runtime: lambda jobs.';

-- The wake-up and the dead-letter record, one home each: every statement that makes a task Queued
-- (a create, a due schedule or retry, a re-announcement) writes its `enqueue_task` row through
-- taskplat_enqueue_wakeups, and every statement that makes a task Dead writes its `dead_letter`
-- row through taskplat_dead_letter. Both read the tasks they are given by primary key (a
-- volatile function sees what the calling statement has written so far), so they are called with
-- the ids the calling statement moved, in the same statement.

CREATE FUNCTION taskplat_enqueue_wakeups(
    p_task_ids uuid[],
    p_now timestamptz,
    p_trace_context jsonb DEFAULT NULL,
    p_hold_seconds double precision DEFAULT 0
) RETURNS TABLE (queue text, held boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
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
    RETURNING o.queue, o.held
    )
    SELECT w.queue, w.held FROM written AS w;
END
$$;

COMMENT ON FUNCTION taskplat_enqueue_wakeups(uuid[], timestamptz, jsonb, double precision) IS
    'The enqueue_task outbox row of each named Queued task (held for a polled queue).';

CREATE FUNCTION taskplat_dead_letter_payload(t tasks) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_build_object(
        'task_id', t.task_id, 'queue', t.queue, 'operator', t.operator,
        'attempt', t.attempt, 'max_attempts', t.max_attempts,
        'dead_reason', t.dead_reason, 'last_error', t.last_error, 'died_at', t.finished_at)
$$;

COMMENT ON FUNCTION taskplat_dead_letter_payload(tasks) IS
    'The dead-letter record of a Dead task (docs/contracts.md).';

CREATE FUNCTION taskplat_dead_letter(
    p_task_ids uuid[],
    p_now timestamptz,
    p_trace_context jsonb DEFAULT NULL
) RETURNS SETOF text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
BEGIN
    IF coalesce(cardinality(p_task_ids), 0) = 0 THEN
        RETURN;
    END IF;
    -- Guard: a record only for a named task that is Dead and whose job (or task) says
    -- `on_exhausted: dead_letter`. Returns the queue of each record written.
    RETURN QUERY
    WITH written AS (
    INSERT INTO outbox AS o (kind, task_id, queue, payload, trace_context, created_at,
                             available_at)
    SELECT 'dead_letter', (x.task).task_id, (x.task).queue,
           taskplat_dead_letter_payload(x.task), p_trace_context, p_now, p_now
    -- By primary key only (OFFSET 0 keeps the status test out of the scan, so the Dead listing
    -- index is never read whole, whatever the statistics).
    FROM (SELECT t AS task FROM tasks AS t WHERE t.task_id = ANY(p_task_ids) OFFSET 0) AS x
    WHERE (x.task).status = 'Dead'
      AND taskplat_dead_letter_wanted((x.task).task_id)
    ORDER BY (x.task).task_id
    RETURNING o.queue
    )
    SELECT w.queue FROM written AS w;
END
$$;

COMMENT ON FUNCTION taskplat_dead_letter(uuid[], timestamptz, jsonb) IS
    'The dead_letter outbox row of each named Dead task whose exhaustion policy wants one.';

-- The completion, one home: how a running attempt ends when its holder reports it (the
-- dispatcher's single and batch completions call this one function).

CREATE FUNCTION taskplat_end_attempts(
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
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Guard (fencing): an element moves its task only while the task is Running the named
    -- attempt under the named lease token; the rows are locked in task_id order (concurrent
    -- batches of overlapping tasks wait for each other, never deadlock). For each element that
    -- matched, in this statement: the task's fate by the rule every ended attempt follows
    -- (taskplat_ended_status: Completed, Failed with a retry at now + backoff, or Dead), the
    -- attempt record closed with its digest (and error, for Failed and Drained), its events
    -- stored and, for Completed, its outputs (replacing those of an earlier completion of a
    -- replayed task). p_ended: Completed, Failed or Drained. Elements name distinct tasks.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    c AS (
        SELECT * FROM unnest(p_task_ids, p_attempts, p_lease_tokens, p_ended, p_results,
                             p_errors, p_retry_afters, p_jitters, p_digests, p_events, p_outputs,
                             p_retryables)
            AS c(task_id, attempt, lease_token, status, result, error, retry_after, jitter,
                 digest, events, outputs, retryable)
    ),
    locked AS MATERIALIZED (
        SELECT t.task_id FROM tasks AS t JOIN c ON c.task_id = t.task_id
        WHERE t.status = 'Running' AND t.attempt = c.attempt AND t.lease_token = c.lease_token
        ORDER BY t.task_id
        FOR UPDATE OF t
    ),
    done AS (
        UPDATE tasks AS t
        SET status = taskplat_ended_status(t, c.status, c.retryable),
            attempt_outcome = c.status,
            result = CASE WHEN c.status = 'Completed' THEN c.result ELSE t.result END,
            last_error = CASE WHEN c.status = 'Completed' THEN t.last_error ELSE c.error END,
            dead_reason = taskplat_dead_reason(t, c.status, c.retryable),
            processing_attempts = t.processing_attempts + (c.status = 'Drained')::int,
            next_retry_at = taskplat_retry_at(t, c.status, c.retryable, n.now, c.retry_after,
                c.jitter),
            finished_at = CASE WHEN taskplat_ended_status(t, c.status, c.retryable) = 'Failed'
                THEN NULL ELSE n.now END,
            lease_expires_at = NULL,
            updated_at = n.now
        FROM n, c, locked AS l
        WHERE t.task_id = c.task_id AND l.task_id = t.task_id AND t.status = 'Running'
          AND t.attempt = c.attempt AND t.lease_token = c.lease_token
        RETURNING t.task_id, t.status, t.queue, t.operator, t.attempt, t.max_attempts,
            t.worker_id, t.started_at, t.dead_reason, t.last_error, t.next_retry_at,
            t.finished_at, n.now AS ended_at, c.status AS reported, c.error, c.digest,
            c.lease_token, c.events, c.outputs
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET finished_at = d.ended_at, outcome = d.reported, completion_digest = d.digest,
            error = CASE WHEN d.reported IN ('Failed', 'Drained') THEN d.error END
        FROM done AS d
        WHERE a.task_id = d.task_id AND a.attempt = d.attempt AND a.lease_token = d.lease_token
    ),
    events AS (
        INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
            partition_key, range_start, range_end, created_at)
        SELECT d.task_id, d.attempt, e.dataset_uuid, e.dataset_version, e.cursor,
            e.partition_key, e.start, e.end, d.ended_at
        FROM done AS d, jsonb_to_recordset(d.events) AS e(
            dataset_uuid uuid, dataset_version uuid, "cursor" bigint, partition_key text,
            "start" bigint, "end" bigint)
        ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
    ),
    outputs AS (
        INSERT INTO task_outputs (task_id, output_index, attempt, dataset_uuid, dataset_version,
            location, "cursor", row_count, committed_at)
        SELECT d.task_id, x.output_index, d.attempt, x.dataset_uuid, x.dataset_version,
            x.location, x.cursor, x.row_count, d.ended_at
        FROM done AS d, jsonb_to_recordset(d.outputs) AS x(
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

COMMENT ON FUNCTION taskplat_end_attempts(uuid[], integer[], uuid[], text[], boolean[], jsonb[],
                                          text[], double precision[], double precision[], text[],
                                          jsonb[], jsonb[], timestamptz) IS
    'Ends the named Running attempts their lease holders report (fenced by attempt and lease).';

-- The timeouts and the retry, one home each: the reaper's and the scheduler's transitions, as
-- functions any caller (their loops, another service's tests) runs the same way.

CREATE FUNCTION taskplat_reap_timeouts(
    p_now timestamptz,
    p_grace_seconds double precision,
    p_limit integer,
    p_jitters double precision[]
) RETURNS TABLE (
    task_id uuid, attempt integer, status text, queue text, operator text, worker_id text,
    dead_reason text, next_retry_at timestamptz, ended text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Running attempts that timed out, at most p_limit, earliest first: the lease ran out
    -- (LeaseExpired: the worker vanished, not the task's fault), or deadline_at + grace passed
    -- even while heartbeats kept the lease fresh (DeadlineExceeded); both: LeaseExpired.
    -- Guard: rows held by a completion or heartbeat are skipped (SKIP LOCKED); a row one of them
    -- changed after this snapshot fails the re-checked status, attempt, lease token and timeout.
    -- The task's fate is the rule every ended attempt follows (taskplat_ended_status); the lease
    -- token stays on the row so a late success of this attempt can still be recognised; a task
    -- that became Dead gets its dead-letter record. p_jitters: one retry jitter per row, in order.
    RETURN QUERY
    WITH n AS (
        SELECT coalesce(p_now, now()) AS now,
               coalesce(p_now, now()) - make_interval(secs => p_grace_seconds) AS overrun
    ),
    due AS (
        SELECT t.task_id, t.attempt, t.lease_token,
               CASE WHEN t.lease_expires_at < n.now THEN 'LeaseExpired'
                    ELSE 'DeadlineExceeded' END AS ended
        FROM tasks AS t, n
        WHERE t.status = 'Running'
          AND (t.lease_expires_at < n.now OR t.deadline_at < n.overrun)
        ORDER BY least(t.lease_expires_at, t.deadline_at)
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    ),
    jittered AS (
        SELECT due.*, p_jitters[row_number() OVER ()] AS jitter FROM due
    ),
    moved AS (
        UPDATE tasks AS t
        SET status = taskplat_ended_status(t, j.ended, true),
            attempt_outcome = j.ended,
            last_error = CASE j.ended WHEN 'LeaseExpired' THEN 'lease expired'
                                      ELSE 'deadline exceeded' END,
            dead_reason = taskplat_dead_reason(t, j.ended, true),
            processing_attempts = t.processing_attempts + (j.ended = 'LeaseExpired')::int,
            next_retry_at = taskplat_retry_at(t, j.ended, true, n.now, NULL,
                                              coalesce(j.jitter, 1.0)),
            finished_at = CASE WHEN taskplat_ended_status(t, j.ended, true) = 'Dead'
                               THEN n.now END,
            lease_expires_at = NULL,
            updated_at = n.now
        FROM jittered AS j, n
        WHERE t.task_id = j.task_id
          AND t.status = 'Running'
          AND t.attempt = j.attempt
          AND t.lease_token = j.lease_token
          AND (t.lease_expires_at < n.now OR t.deadline_at < n.overrun)
        RETURNING t.task_id, t.attempt, t.lease_token, t.status, t.queue, t.operator,
                  t.worker_id, t.dead_reason, t.last_error, t.next_retry_at, j.ended
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET finished_at = n.now, outcome = m.ended, error = m.last_error
        FROM moved AS m, n
        WHERE a.task_id = m.task_id AND a.attempt = m.attempt AND a.lease_token = m.lease_token
          AND a.outcome IS NULL
    ),
    dead AS (
        SELECT count(*) AS written
        FROM n, taskplat_dead_letter(
            ARRAY(SELECT m.task_id FROM moved AS m WHERE m.status = 'Dead'), n.now)
    )
    SELECT m.task_id, m.attempt, m.status, m.queue, m.operator, m.worker_id, m.dead_reason,
           m.next_retry_at, m.ended
    FROM moved AS m, dead;  -- dead: one row, read so that it runs
END
$$;

COMMENT ON FUNCTION taskplat_reap_timeouts(timestamptz, double precision, integer,
                                           double precision[]) IS
    'Ends Running attempts whose lease ran out or whose deadline + grace passed.';

CREATE FUNCTION taskplat_expire_unstarted(p_now timestamptz, p_limit integer)
RETURNS TABLE (
    task_id uuid, attempt integer, status text, queue text, operator text, dead_reason text,
    expired_from text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Queued or Scheduled tasks past expires_at, at most p_limit, earliest first: Dead
    -- (Expired), with their dead-letter records. A Running task is never expired. Guard: locked
    -- rows are skipped; the status, attempt and expiry are re-checked when moving.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    due AS (
        SELECT t.task_id, t.attempt, t.status
        FROM tasks AS t, n
        WHERE t.status IN ('Queued', 'Scheduled')
          AND t.expires_at IS NOT NULL
          AND t.expires_at <= n.now
        ORDER BY t.expires_at
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    ),
    moved AS (
        UPDATE tasks AS t
        SET status = 'Dead',
            dead_reason = 'Expired',
            last_error = 'expired before it started',
            next_retry_at = NULL,
            lease_expires_at = NULL,
            finished_at = n.now,
            updated_at = n.now
        FROM due, n
        WHERE t.task_id = due.task_id
          AND t.status = due.status
          AND t.attempt = due.attempt
          AND t.expires_at <= n.now
        RETURNING t.task_id, t.attempt, t.status, t.queue, t.operator, t.dead_reason,
                  due.status AS expired_from
    ),
    dead AS (
        SELECT count(*) AS written
        FROM n, taskplat_dead_letter(ARRAY(SELECT m.task_id FROM moved AS m), n.now)
    )
    SELECT m.task_id, m.attempt, m.status, m.queue, m.operator, m.dead_reason, m.expired_from
    FROM moved AS m, dead;  -- dead: one row, read so that it runs
END
$$;

COMMENT ON FUNCTION taskplat_expire_unstarted(timestamptz, integer) IS
    'Queued or Scheduled tasks past expires_at become Dead (Expired).';

CREATE FUNCTION taskplat_queue_due(
    p_now timestamptz,
    p_promote_limit integer,
    p_retry_limit integer
) RETURNS TABLE (task_id uuid, attempt integer, queue text, operator text, moved_from text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Scheduled -> Queued once scheduled_for has come (at most p_promote_limit), and
    -- Failed -> Queued at next_retry_at (at most p_retry_limit), each with its wake-up
    -- (taskplat_enqueue_wakeups). A retry is the same row, attempt + 1, with the ended attempt's
    -- lease fields cleared (a Queued task holds no lease; a late reply of the old attempt is
    -- stale by its attempt number). replay_offset, processing_attempts, last_error and the
    -- attempt history are kept. A Scheduled task already past expires_at is left to expire.
    -- Guard: locked rows are skipped (SKIP LOCKED), and FOR UPDATE re-tests each selection's
    -- WHERE on the newest row version, so the move itself goes by primary key only.
    RETURN QUERY
    WITH n AS (SELECT coalesce(p_now, now()) AS now),
    due_scheduled AS (
        SELECT t.task_id, t.attempt, t.status
        FROM tasks AS t, n
        WHERE t.status = 'Scheduled'
          AND t.scheduled_for <= n.now
          AND (t.expires_at IS NULL OR t.expires_at > n.now)
        ORDER BY t.scheduled_for
        LIMIT p_promote_limit
        FOR UPDATE OF t SKIP LOCKED
    ),
    due_failed AS (
        SELECT t.task_id, t.attempt, t.status
        FROM tasks AS t, n
        WHERE t.status = 'Failed'
          AND t.next_retry_at <= n.now
        ORDER BY t.next_retry_at
        LIMIT p_retry_limit
        FOR UPDATE OF t SKIP LOCKED
    ),
    due AS (SELECT * FROM due_scheduled UNION ALL SELECT * FROM due_failed),
    moved AS (
        UPDATE tasks AS t
        SET status = 'Queued',
            -- t.status: the status the row was locked in (Scheduled or Failed).
            attempt = t.attempt + (t.status = 'Failed')::integer,
            attempt_outcome = NULL,
            next_retry_at = NULL,
            lease_token = NULL,
            lease_expires_at = NULL,
            deadline_at = NULL,
            worker_id = NULL,
            started_at = NULL,
            finished_at = NULL,
            queued_at = n.now,
            updated_at = n.now
        FROM n
        WHERE t.task_id = ANY(ARRAY(SELECT d.task_id FROM due AS d))
        RETURNING t.task_id, t.attempt, t.queue, t.operator
    ),
    woken AS (
        SELECT count(*) AS written
        FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT m.task_id FROM moved AS m), n.now)
    )
    SELECT m.task_id, m.attempt, m.queue, m.operator, d.status AS moved_from
    FROM moved AS m JOIN due AS d ON d.task_id = m.task_id, woken;  -- woken: read so it runs
END
$$;

COMMENT ON FUNCTION taskplat_queue_due(timestamptz, integer, integer) IS
    'Scheduled tasks whose time came and Failed tasks whose retry is due become Queued.';
