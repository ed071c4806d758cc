-- Flow control enforced: concurrency keys and their fairness at creation, queue limits at every
-- start and end of a task (docs/flow-control.md).
--
-- Invariants:
--   * Creation (taskplat_create_tasks, the one home) writes a task's concurrency key (its job's
--     for a job run) and its stride pass: the new tasks of one (queue, key) get consecutive
--     passes after the greater of the key's newest Queued task's pass and the queue's front
--     (the pass of the task claim-next would take next at that priority; 0 when none is
--     Queued). So a key with a backlog queues behind its own tasks, and a key that was idle
--     starts at the front, taking turns with the others instead of waiting behind them or
--     jumping ahead. It is read from the tasks alone (tasks_queued_key_idx): a create writes no
--     shared row, so creates never wait for each other; two creates of one key at once may give
--     equal passes (ties go by queued_at), which fairness does not mind. Claim-next takes the
--     claimable tasks of a queue by priority, then pass, then queued_at
--     (tasks_queued_claim_idx): within a priority the keys take turns, and a key with 10,000
--     queued tasks cannot starve a key with 10. Tasks without a key share one key of their own
--     ('').
--   * Admission has one home, a BEFORE UPDATE trigger on the Queued -> Running transition
--     (taskplat_admit_start), so every claim path (by id, batch, claim-next, waiting claims,
--     claims ahead, Lambda invocations) is held to the limits with no copy of the rule: under
--     the queue's limits lock (shared) and its row's lock, a task of a queue with limits starts
--     only if the queue has a slot (`running < concurrency_limit`), the GCRA test of the rate
--     passes, and its key's counter moves (`running < key_concurrency_limit`). Locks are taken in
--     one order, the queue's row then the key's, by admission and release alike. A task
--     refused is left untouched: the trigger skips its row, so it stays Queued with its place,
--     spends no attempt and gets no attempt record; the claim answers without it.
--   * Release has one home, a BEFORE UPDATE trigger on every Running -> other transition
--     (taskplat_release_slot): completion, failure, lease expiry, deadline, cancel, drain; in the
--     same transaction as the end, under the same lock; it takes 1 from the queue's and the key's
--     counters while they are kept, and, when the queue or the key was at its limit, NOTIFYs
--     `taskplat_queued` with the queue (waiting claims of the queue try again).
--   * taskplat_limit_refusal says why a Queued task of a limited queue cannot start now and when
--     to try again (`retry_after_ms`); it decides nothing (the trigger does).

ALTER TABLE tasks ADD COLUMN pass bigint NOT NULL DEFAULT 0;

CREATE INDEX tasks_queued_claim_idx ON tasks (queue, priority, pass, queued_at)
    WHERE status = 'Queued';
CREATE INDEX tasks_queued_key_idx ON tasks (queue, (coalesce(concurrency_key, '')), pass)
    WHERE status = 'Queued';
DROP INDEX tasks_queued_priority_idx;

-- task_details lists t.*, expanded when the view was made: made again to show the key and pass.
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

ALTER TYPE taskplat_new_task ADD ATTRIBUTE concurrency_key text;

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
                       NULL, p_idempotency_key, j.priority, j.concurrency_key)::taskplat_new_task],
             p_now, p_trace_context, p_hold_seconds) AS c
    WHERE j.dag_name = p_dag_name AND j.name = p_job_name
$$;

-- Admission: the one home of the queue limits at a start (see the top).
CREATE FUNCTION taskplat_admit_start() RETURNS trigger
LANGUAGE plpgsql AS $$
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

CREATE TRIGGER tasks_admit_start
    BEFORE UPDATE OF status ON tasks
    FOR EACH ROW
    WHEN (OLD.status = 'Queued' AND NEW.status = 'Running')
    EXECUTE FUNCTION taskplat_admit_start();

-- Release: the one home of giving a Running task's slot back (see the top).
CREATE FUNCTION taskplat_release_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_was_full boolean;
    v_key_limit integer;
    v_key_was_full boolean;
BEGIN
    PERFORM taskplat_limits_lock(OLD.queue);
    UPDATE queues AS u SET running = u.running - 1
    WHERE u.name = OLD.queue
      AND (u.concurrency_limit IS NOT NULL OR u.key_concurrency_limit IS NOT NULL)
    RETURNING u.running + 1 >= u.concurrency_limit, u.key_concurrency_limit
        INTO v_was_full, v_key_limit;
    IF FOUND THEN
        UPDATE queue_keys AS k SET running = k.running - 1
        WHERE k.queue = OLD.queue AND k.concurrency_key = coalesce(OLD.concurrency_key, '')
        RETURNING k.running + 1 >= v_key_limit INTO v_key_was_full;
        -- Waiting claims of the queue are told only when a limit held them back: a NOTIFY at
        -- every end would take the notification queue's lock at every commit.
        IF coalesce(v_was_full, false) OR coalesce(v_key_was_full, false) THEN
            PERFORM pg_notify('taskplat_queued', OLD.queue);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER tasks_release_slot
    BEFORE UPDATE OF status ON tasks
    FOR EACH ROW
    WHEN (OLD.status = 'Running' AND NEW.status <> 'Running')
    EXECUTE FUNCTION taskplat_release_slot();

-- Why a Queued task of a limited queue cannot start now, and in how many milliseconds to try
-- again: the concurrency limits first, then the rate. No row when nothing holds it back.
CREATE FUNCTION taskplat_limit_refusal(
    p_queue text, p_concurrency_key text, p_now timestamptz DEFAULT NULL
) RETURNS TABLE (reason text, retry_after_ms integer)
LANGUAGE sql STABLE AS $$
    WITH n AS (SELECT greatest(p_now, clock_timestamp()) AS now),  -- as the start stamps it
    q AS (
        SELECT u.*,
               coalesce((SELECT k.running FROM queue_keys AS k
                         WHERE k.queue = u.name
                           AND k.concurrency_key = coalesce(p_concurrency_key, '')), 0)
                   AS key_running
        FROM queues AS u WHERE u.name = p_queue
    )
    SELECT r.reason, r.retry_after_ms
    FROM q, n, LATERAL (VALUES
        (1, 'ConcurrencyLimited', 1000,
         q.concurrency_limit IS NOT NULL AND q.running >= q.concurrency_limit),
        (2, 'KeyConcurrencyLimited', 1000,
         q.key_concurrency_limit IS NOT NULL AND q.key_running >= q.key_concurrency_limit),
        (3, 'RateLimited',
         least(3600000, greatest(1, ceil(extract(epoch FROM
             q.rate_tat - make_interval(secs => (q.rate_burst - 1) / q.rate_per_second) - n.now)
             * 1000)))::integer,
         q.rate_per_second IS NOT NULL
             AND taskplat_rate_tokens_left(q.rate_tat, q.rate_per_second, q.rate_burst, n.now) = 0)
    ) AS r(rank, reason, retry_after_ms, holds)
    WHERE r.holds
    ORDER BY r.rank
    LIMIT 1
$$;

-- Claim-next: as in migration 0026, in (priority, pass, queued_at) order; a queue at its
-- concurrency limit or out of rate tokens answers nothing at once, never more tasks are locked
-- than may start, and the tasks of keys at their limit are passed over for other keys'.
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
    v_max integer := p_max;
    v_key_limit integer;
    v_picked uuid[];
    v_queue queues;
BEGIN
    -- Guard: claimable (Queued, unexpired, queue not paused, trusted unless the claimer holds
    -- capability keys) and not a `runtime: lambda` job's task (the relay claims those for their
    -- function); rows others are claiming are skipped. The limits themselves are decided by the
    -- start (taskplat_admit_start): what is read here only spares locking tasks that could not
    -- start.
    SELECT * INTO v_queue FROM queues WHERE name = p_queue;
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
          AND (t.expires_at IS NULL OR t.expires_at > v_now)
          AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = p_queue AND q.paused)
          AND (t.job IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs AS j
                              WHERE j.dag_name = t.job ->> 'dag_name'
                                AND j.name = t.job ->> 'name'
                                AND j.runtime = 'lambda'))
          AND (p_capability_keys OR NOT taskplat_untrusted(t.job, t.operator, p_untrusted_operators))
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

COMMENT ON FUNCTION taskplat_claim_next(text, integer, text, double precision, integer,
                                        timestamptz, boolean, text[]) IS
    'Claims up to p_max claimable tasks of a queue, by priority, then pass (keys in turn), then '
    'oldest first, within its limits, skipping locked rows and the tasks of runtime: lambda jobs.';
