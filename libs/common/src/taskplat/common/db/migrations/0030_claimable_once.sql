-- One home for "claimable" (docs/explanation/guarantees.md): a task's own part of it in one
-- function, its queue's part in the start's admission.
--
-- Invariants:
--   * `taskplat_claimable` states what a Queued task must be to start, of itself: unexpired at
--     the claim's now, and trusted unless the claimer holds capability keys. It is a plain SQL
--     expression (no subquery), so the planner inlines it where it is called: the batch claim's
--     lock, claim-next's pick and the start's UPDATE (which re-tests it on the newest version of
--     each row it locks, so one claim wins). Each caller keeps its own test of `status`: by
--     primary key (`IS TRUE`) for named tasks, by the Queued index for claim-next.
--   * A paused queue starts nothing: the admission trigger (`taskplat_admit_start`), which every
--     Queued -> Running transition passes and which reads the queue's row already, skips the
--     row (it stays Queued, as a limit leaves it). Claim-next returns at once for a paused queue
--     instead of locking tasks that could not start.

-- Unexpired at p_now, and trusted unless the claimer holds capability keys.
CREATE FUNCTION taskplat_claimable(
    t tasks, p_now timestamptz, p_capability_keys boolean, p_untrusted_operators text[]
) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT (t.expires_at IS NULL OR t.expires_at > p_now)
       AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
$$;

COMMENT ON FUNCTION taskplat_claimable(tasks, timestamptz, boolean, text[]) IS
    'Whether a Queued task may start, of itself: unexpired, and trusted unless the claimer holds capability keys.';

CREATE OR REPLACE FUNCTION taskplat_admit_start() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    q queues;
    v_key constant text := coalesce(NEW.concurrency_key, '');
    v_at timestamptz;
    v_step interval;
    v_tat timestamptz;
    v_counted boolean;
BEGIN
    PERFORM taskplat_limits_lock(NEW.queue);
    SELECT * INTO q FROM queues WHERE name = NEW.queue;
    IF FOUND AND q.paused THEN
        RETURN NULL;  -- Paused: the row is left as it was
    END IF;
    IF NOT FOUND OR (q.concurrency_limit IS NULL AND q.key_concurrency_limit IS NULL
                     AND q.rate_per_second IS NULL) THEN
        RETURN NEW;
    END IF;
    -- Locks in one order (the queue's row, then its key's), as the release takes them.
    SELECT * INTO q FROM queues WHERE name = NEW.queue FOR UPDATE;
    -- A limited start is stamped once it holds the queue's row (never before the claim's now):
    -- a slot freed by an end that committed just before is then never seen overlapping this
    -- start in the attempts' own times, and the rate counts starts at those times.
    v_at := greatest(NEW.started_at, clock_timestamp());
    NEW.started_at := v_at;
    v_counted := q.concurrency_limit IS NOT NULL OR q.key_concurrency_limit IS NOT NULL;
    IF q.concurrency_limit IS NOT NULL AND q.running >= q.concurrency_limit THEN
        RETURN NULL;  -- ConcurrencyLimited: the row is left as it was
    END IF;
    IF q.rate_per_second IS NOT NULL THEN
        v_step := make_interval(secs => 1.0 / q.rate_per_second);
        v_tat := greatest(coalesce(q.rate_tat, v_at), v_at) + v_step;
        IF v_tat - v_at > v_step * q.rate_burst THEN
            RETURN NULL;  -- RateLimited
        END IF;
    END IF;
    IF v_counted THEN
        INSERT INTO queue_keys AS k (queue, concurrency_key, running)
        VALUES (NEW.queue, v_key, 1)
        ON CONFLICT (queue, concurrency_key) DO UPDATE SET running = k.running + 1
            WHERE q.key_concurrency_limit IS NULL OR k.running < q.key_concurrency_limit;
        IF NOT FOUND THEN
            RETURN NULL;  -- KeyConcurrencyLimited
        END IF;
    END IF;
    UPDATE queues AS u
    SET running = u.running + v_counted::integer,
        rate_tat = coalesce(v_tat, u.rate_tat)
    WHERE u.name = NEW.queue;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION taskplat_start_attempts(p_task_ids uuid[], p_now timestamp with time zone, p_worker_id text, p_lease_seconds double precision, p_default_timeout_seconds integer, p_lease_token uuid DEFAULT NULL::uuid, p_function_prefix text DEFAULT NULL::text, p_grace_seconds double precision DEFAULT 0, p_capability_keys boolean DEFAULT true, p_untrusted_operators text[] DEFAULT '{}'::text[]) RETURNS SETOF taskplat_claimed_task
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
BEGIN
    -- Guard: only the named rows still claimable move (Queued and `taskplat_claimable`; a
    -- paused queue's are skipped by the admission trigger); the UPDATE re-tests it on the
    -- newest version of each row it locks, so one claim wins.
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
          AND taskplat_claimable(t, p_now, p_capability_keys, p_untrusted_operators)
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

CREATE OR REPLACE FUNCTION taskplat_claim(p_task_ids uuid[], p_worker_id text, p_lease_seconds double precision, p_default_timeout_seconds integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_lease_token uuid DEFAULT NULL::uuid, p_function_prefix text DEFAULT NULL::text, p_grace_seconds double precision DEFAULT 0, p_capability_keys boolean DEFAULT true, p_untrusted_operators text[] DEFAULT '{}'::text[]) RETURNS SETOF taskplat_claimed_task
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_locked uuid[];
BEGIN
    -- Guard: claimable (Queued and `taskplat_claimable`; taskplat_start_attempts tests it).
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
          AND taskplat_claimable(t, v_now, p_capability_keys, p_untrusted_operators)
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

CREATE OR REPLACE FUNCTION taskplat_claim_next(p_queue text, p_max integer, p_worker_id text, p_lease_seconds double precision, p_default_timeout_seconds integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_capability_keys boolean DEFAULT true, p_untrusted_operators text[] DEFAULT '{}'::text[]) RETURNS SETOF taskplat_claimed_task
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_max integer := p_max;
    v_key_limit integer;
    v_picked uuid[];
    v_queue queues;
BEGIN
    -- Guard: claimable (Queued and `taskplat_claimable`; nothing of a paused queue) and not a
    -- `runtime: lambda` job's task (the relay claims those for their
    -- function); rows others are claiming are skipped. The limits themselves are decided by the
    -- start (taskplat_admit_start): what is read here only spares locking tasks that could not
    -- start.
    SELECT * INTO v_queue FROM queues WHERE name = p_queue;
    IF FOUND AND v_queue.paused THEN
        RETURN;  -- the start would refuse every task of it (taskplat_admit_start)
    END IF;
    IF FOUND THEN
        IF v_queue.concurrency_limit IS NOT NULL THEN
            v_max := least(v_max, v_queue.concurrency_limit - v_queue.running);
        END IF;
        IF v_queue.rate_per_second IS NOT NULL THEN
            v_max := least(v_max, taskplat_rate_tokens_left(
                v_queue.rate_tat, v_queue.rate_per_second, v_queue.rate_burst,
                greatest(v_now, clock_timestamp())));  -- as the start stamps it
        END IF;
        v_key_limit := v_queue.key_concurrency_limit;
    END IF;
    IF v_max <= 0 THEN
        RETURN;
    END IF;
    v_picked := ARRAY(
        SELECT t.task_id
        FROM tasks AS t
        WHERE t.status = 'Queued'
          AND t.queue = p_queue
          AND taskplat_claimable(t, v_now, p_capability_keys, p_untrusted_operators)
          AND (t.job IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs AS j
                              WHERE j.dag_name = t.job ->> 'dag_name'
                                AND j.name = t.job ->> 'name'
                                AND j.runtime = 'lambda'))
          AND (v_key_limit IS NULL
               OR NOT EXISTS (SELECT 1 FROM queue_keys AS k
                              WHERE k.queue = p_queue
                                AND k.concurrency_key = coalesce(t.concurrency_key, '')
                                AND k.running >= v_key_limit))
        ORDER BY t.queue, t.priority, t.pass, t.queued_at
        LIMIT v_max
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

