-- Flow control's data: concurrency keys on tasks and jobs, a queue's limits, and the counters the
-- claim moves (docs/flow-control.md).
--
-- Invariants:
--   * tasks.concurrency_key and jobs.concurrency_key are NULL or 1-200 printable characters;
--     tasks without a key share one key of their own (NULL, counted under '').
--   * A queue's limits are columns of its `queues` row: `concurrency_limit` (Running tasks of the
--     queue at once), `key_concurrency_limit` (Running tasks per key), `rate_per_second` with
--     `rate_burst` (a token bucket of starts, both set or both NULL). Each is NULL (no limit) or
--     positive. taskplat_set_queue_limits is the one writer of them.
--   * While a queue has a concurrency limit or a key limit, `queues.running` and
--     `queue_keys.running` count its Running tasks (per queue, per key): every claim that starts
--     one adds 1 with a conditional UPDATE (`WHERE running < limit`), every end of a Running task
--     takes 1 in the same transaction. taskplat_set_queue_limits recounts both from `tasks` when
--     it sets limits, holding the queue's limits lock (an advisory lock, taskplat_limits_lock)
--     exclusively, while every start and every end of a task holds it shared (migration 0028): no
--     start or end is in flight during a recount, so counting starts exact. With no concurrency
--     or key limit the counters are not kept (0) and a start writes no queue row.
--   * The rate limit is GCRA: `queues.rate_tat` is the theoretical arrival time of the next
--     start. A start at `now` is allowed when greatest(rate_tat, now) + 1/rate - now <= burst/rate,
--     and moves rate_tat to greatest(rate_tat, now) + 1/rate. taskplat_rate_tokens_left answers
--     the starts allowed at once now (0..burst). Time here is never before the clock: a start is
--     stamped greatest(the claim's now, clock_timestamp()) (migration 0028), and every reading
--     of the bucket uses the same.

ALTER TABLE tasks ADD COLUMN concurrency_key text
    CONSTRAINT tasks_concurrency_key_check
        CHECK (concurrency_key ~ '^[[:print:]]{1,200}$');
ALTER TABLE jobs ADD COLUMN concurrency_key text
    CONSTRAINT jobs_concurrency_key_check
        CHECK (concurrency_key ~ '^[[:print:]]{1,200}$');

ALTER TABLE queues
    ADD COLUMN concurrency_limit integer CONSTRAINT queues_concurrency_limit_check
        CHECK (concurrency_limit BETWEEN 1 AND 1000000),
    ADD COLUMN key_concurrency_limit integer CONSTRAINT queues_key_concurrency_limit_check
        CHECK (key_concurrency_limit BETWEEN 1 AND 1000000),
    ADD COLUMN rate_per_second double precision CONSTRAINT queues_rate_per_second_check
        CHECK (rate_per_second >= 0.001 AND rate_per_second <= 1000000),
    ADD COLUMN rate_burst integer CONSTRAINT queues_rate_burst_check
        CHECK (rate_burst BETWEEN 1 AND 1000000),
    ADD COLUMN rate_tat timestamptz,
    ADD COLUMN running integer NOT NULL DEFAULT 0 CONSTRAINT queues_running_check
        CHECK (running >= 0),
    ADD COLUMN limits_updated_at timestamptz,
    ADD CONSTRAINT queues_rate_limit_check
        CHECK ((rate_per_second IS NULL) = (rate_burst IS NULL));

CREATE TABLE queue_keys (
    queue text NOT NULL,  -- a task's queue (tasks name no registered queue by key either)
    concurrency_key text NOT NULL,
    running integer NOT NULL DEFAULT 0 CHECK (running >= 0),
    PRIMARY KEY (queue, concurrency_key)
);

-- queue_keys has no index but its key: its counters change at every start and end of a limited
-- queue's task, and stay HOT updates (a second index on them would bloat the row's versions).

-- The two keys of a queue's limits lock (an advisory lock: held shared by starts and ends,
-- exclusively by taskplat_set_queue_limits).
CREATE FUNCTION taskplat_limits_lock(p_queue text, p_exclusive boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1952541776, hashtext(p_queue));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1952541776, hashtext(p_queue));
    END IF;
END
$$;

CREATE FUNCTION taskplat_rate_tokens_left(
    p_tat timestamptz, p_per_second double precision, p_burst integer, p_now timestamptz
) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_per_second IS NULL THEN NULL
        ELSE greatest(0, least(p_burst, floor(
            (p_burst::double precision / p_per_second
             - extract(epoch FROM greatest(coalesce(p_tat, p_now), p_now) - p_now))
            * p_per_second + 1e-9)::integer))
    END
$$;

-- Sets (replaces) a queue's limits, registering the queue if new, and recounts the counters the
-- claim keeps while a concurrency or key limit is set. The limits lock, taken first and
-- exclusively, waits for the starts and ends in flight and holds new ones until it commits.
CREATE FUNCTION taskplat_set_queue_limits(
    p_queue text, p_concurrency_limit integer, p_key_concurrency_limit integer,
    p_rate_per_second double precision, p_rate_burst integer, p_now timestamptz DEFAULT NULL
) RETURNS SETOF queues
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_counted boolean := p_concurrency_limit IS NOT NULL OR p_key_concurrency_limit IS NOT NULL;
BEGIN
    PERFORM taskplat_limits_lock(p_queue, true);
    INSERT INTO queues AS q (name, created_at, updated_at)
    VALUES (p_queue, v_now, v_now)
    ON CONFLICT (name) DO NOTHING;

    UPDATE queues SET
        concurrency_limit = p_concurrency_limit,
        key_concurrency_limit = p_key_concurrency_limit,
        rate_per_second = p_rate_per_second,
        rate_burst = p_rate_burst,
        rate_tat = CASE WHEN p_rate_per_second IS NULL THEN NULL ELSE rate_tat END,
        running = CASE WHEN v_counted THEN (
            SELECT count(*) FROM tasks AS t WHERE t.queue = p_queue AND t.status = 'Running')
            ELSE 0 END,
        limits_updated_at = v_now,
        updated_at = v_now
    WHERE name = p_queue;

    UPDATE queue_keys AS k SET running = 0
    WHERE k.queue = p_queue AND k.running <> 0;
    IF v_counted THEN
        INSERT INTO queue_keys AS k (queue, concurrency_key, running)
        SELECT p_queue, coalesce(t.concurrency_key, ''), count(*)
        FROM tasks AS t
        WHERE t.queue = p_queue AND t.status = 'Running'
        GROUP BY coalesce(t.concurrency_key, '')
        ON CONFLICT (queue, concurrency_key) DO UPDATE SET running = excluded.running;
    END IF;

    RETURN QUERY SELECT * FROM queues WHERE name = p_queue;
END
$$;

-- A queue's limits and their use now: Running tasks, keys at their limit, tokens left.
CREATE FUNCTION taskplat_queue_limits_use(p_queues text[], p_now timestamptz DEFAULT NULL)
RETURNS TABLE (
    queue text, concurrency_limit integer, key_concurrency_limit integer,
    rate_per_second double precision, rate_burst integer,
    running integer, keys_at_limit integer, tokens_left integer
)
LANGUAGE sql STABLE AS $$
    SELECT q.name, q.concurrency_limit, q.key_concurrency_limit, q.rate_per_second, q.rate_burst,
           q.running,
           CASE WHEN q.key_concurrency_limit IS NULL THEN 0 ELSE (
               SELECT count(*)::integer FROM queue_keys AS k
               WHERE k.queue = q.name AND k.running > 0
                 AND k.running >= q.key_concurrency_limit) END,
           taskplat_rate_tokens_left(q.rate_tat, q.rate_per_second, q.rate_burst,
                                     greatest(p_now, clock_timestamp()))
    FROM queues AS q
    WHERE q.name = ANY (p_queues)
$$;
