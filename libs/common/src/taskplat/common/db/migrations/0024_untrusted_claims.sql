-- No untrusted task is handed out without its capability token: the claim's own rule.
--
-- A dispatcher (or relay) without capability keys cannot sign a capability token. Creating or
-- applying untrusted work is refused then (422), but work created while the keys were there
-- stays Queued after they are removed. The claim functions (migration 0020) now take
-- p_capability_keys, whether the claimer can sign, and p_untrusted_operators, the operators its
-- settings run as untrusted; a claimer that cannot sign claims no untrusted task: the task is
-- not claimable for it, so it stays Queued, unchanged, and spends no attempt (nothing is written).
--
-- Invariants:
--   * untrusted = the task's job says `trust: untrusted` or its operator is one of
--     p_untrusted_operators (taskplat_untrusted, the one home of that rule in SQL; the claim
--     answers' `trust` says the same);
--   * claimable = Queued, not past expires_at, its queue not paused, and trusted unless
--     p_capability_keys: every claim step tests it (the lock of named ids, the pick of
--     claim-next, the moving UPDATE), so a refused task is never locked for update by a claim;
--   * p_capability_keys defaults to true (as before this migration); every service passes it.
--
-- The signatures change, so the three functions are dropped and created again (nothing in the
-- schema depends on them; their callers are statements of the services). What they return, the
-- row a claim answers (the columns of the claim payload), is one type, taskplat_claimed_task,
-- instead of a column list written out in each.

CREATE FUNCTION taskplat_untrusted(
    p_job jsonb, p_operator text, p_untrusted_operators text[]
) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT p_operator = ANY(coalesce(p_untrusted_operators, '{}'))
           OR (p_job IS NOT NULL AND taskplat_job_trust(p_job) = 'untrusted')
$$;

COMMENT ON FUNCTION taskplat_untrusted(jsonb, text, text[]) IS
    'Whether a task runs untrusted: its job says trust untrusted or its operator is listed.';

CREATE TYPE taskplat_claimed_task AS (
    task_id uuid,
    attempt integer,
    job jsonb,
    operator text,
    queue text,
    config jsonb,
    inputs jsonb,
    timeout_seconds integer,
    deadline_at timestamptz,
    lease_token uuid,
    lease_expires_at timestamptz,
    worker_id text,
    started_at timestamptz,
    queued_at timestamptz,
    created_at timestamptz,
    replay_offset integer,
    outputs jsonb,
    trust text,
    steps jsonb,
    trace_context jsonb
);

COMMENT ON TYPE taskplat_claimed_task IS 'A claimed task as a claim answers it (the claim payload).';

DROP FUNCTION taskplat_claim_next(text, integer, text, double precision, integer, timestamptz);
DROP FUNCTION taskplat_claim(uuid[], text, double precision, integer, timestamptz, uuid, text,
                             double precision);
DROP FUNCTION taskplat_start_attempts(uuid[], timestamptz, text, double precision, integer, uuid,
                                      text, double precision);

CREATE FUNCTION taskplat_start_attempts(
    p_task_ids uuid[],
    p_now timestamptz,
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_lease_token uuid DEFAULT NULL,
    p_function_prefix text DEFAULT NULL,
    p_grace_seconds double precision DEFAULT 0,
    p_capability_keys boolean DEFAULT true,
    p_untrusted_operators text[] DEFAULT '{}'
) RETURNS SETOF taskplat_claimed_task
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
BEGIN
    -- Guard: only the named rows still claimable move (Queued, unexpired, queue not paused,
    -- and trusted unless the claimer holds capability keys);
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
          AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
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
    SELECT c.* FROM claimed AS c;  -- RETURNING lists taskplat_claimed_task's fields in order
END
$$;

COMMENT ON FUNCTION taskplat_start_attempts(uuid[], timestamptz, text, double precision, integer,
                                            uuid, text, double precision, boolean, text[]) IS
    'Queued -> Running of rows the caller locked as claimable, with their attempt records.';

CREATE FUNCTION taskplat_claim(
    p_task_ids uuid[],
    p_worker_id text,
    p_lease_seconds double precision,
    p_default_timeout_seconds integer,
    p_now timestamptz DEFAULT NULL,
    p_lease_token uuid DEFAULT NULL,
    p_function_prefix text DEFAULT NULL,
    p_grace_seconds double precision DEFAULT 0,
    p_capability_keys boolean DEFAULT true,
    p_untrusted_operators text[] DEFAULT '{}'
) RETURNS SETOF taskplat_claimed_task
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_locked uuid[];
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused, trusted unless the claimer holds
    -- capability keys; taskplat_start_attempts tests it).
    -- Several tasks are locked in task_id order first; one is locked by its UPDATE alone.
    IF cardinality(p_task_ids) = 1 THEN
        RETURN QUERY
        SELECT * FROM taskplat_start_attempts(p_task_ids, v_now, p_worker_id, p_lease_seconds,
                                              p_default_timeout_seconds, p_lease_token,
                                              p_function_prefix, p_grace_seconds,
                                              p_capability_keys, p_untrusted_operators);
        RETURN;
    END IF;
    v_locked := ARRAY(
        SELECT t.task_id
        FROM tasks AS t
        WHERE t.task_id = ANY(p_task_ids)
          AND (t.status = 'Queued') IS TRUE  -- by primary key, never the Queued index (see top)
          AND (t.expires_at IS NULL OR t.expires_at > v_now)
          AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused)
          AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
        ORDER BY t.task_id
        FOR UPDATE OF t);
    IF cardinality(v_locked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT * FROM taskplat_start_attempts(v_locked, v_now, p_worker_id, p_lease_seconds,
                                          p_default_timeout_seconds, p_lease_token,
                                          p_function_prefix, p_grace_seconds,
                                          p_capability_keys, p_untrusted_operators);
END
$$;

COMMENT ON FUNCTION taskplat_claim(uuid[], text, double precision, integer, timestamptz, uuid, text,
                                   double precision, boolean, text[]) IS
    'Claims the named tasks that are Queued, unexpired, of an unpaused queue and trusted unless '
    'the claimer holds capability keys (task_id order).';

CREATE FUNCTION taskplat_claim_next(
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
SET plan_cache_mode = force_generic_plan  -- planned once per session (see top)
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_picked uuid[];
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused, trusted unless the claimer holds
    -- capability keys) and not a `runtime: lambda` job's
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
          AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
        ORDER BY t.queued_at
        LIMIT p_max
        FOR UPDATE OF t SKIP LOCKED);
    IF cardinality(v_picked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.* FROM taskplat_start_attempts(v_picked, v_now, p_worker_id, p_lease_seconds,
                                            p_default_timeout_seconds, NULL, NULL, 0,
                                            p_capability_keys, p_untrusted_operators) AS s
    ORDER BY s.queued_at, s.task_id;
END
$$;

COMMENT ON FUNCTION taskplat_claim_next(text, integer, text, double precision, integer,
                                        timestamptz, boolean, text[]) IS
    'Claims up to p_max claimable tasks of a queue, oldest first, skipping locked rows and '
    'the tasks of runtime: lambda jobs.';
