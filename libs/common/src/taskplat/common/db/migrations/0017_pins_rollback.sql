-- Pins, versions and rollback (docs/ARCHITECTURE.md "Pins, versions and rollback").
--
-- Invariants:
--   * a version is never deleted. Each version records when it last became current
--     (`current_since`) and how (`became_current`: `created` by a new version, `rollback` when an
--     earlier version was made current again); `superseded_at` is when it last stopped being
--     current (NULL while it is current).
--   * every change of a dataset's current version goes through taskplat_make_version_current,
--     whose caller holds the dataset row FOR UPDATE: it cancels the live tasks pinned to another
--     version of the dataset (`VersionSuperseded`) in the same transaction. Whoever reads the
--     current version to act on it (routing, pinning a new task, a replay's pin check) takes the
--     row FOR SHARE first, in an earlier statement of its transaction, so it sees the latest
--     committed current version and a change waits for it to commit (and then cancels what it
--     pinned).
--   * task_pins derive from a task's inputs: every entry naming both `dataset_uuid` and
--     `dataset_version` (taskplat_input_pins), whichever statement writes the task.
--   * a replay of a task pinned to a version that is no longer current is refused, or re-pins it
--     to the current versions (its inputs' `dataset_version` rewritten, its pins replaced):
--     taskplat_replay_pins, the one home of that rule for the single and the bulk replay.
--   * event_positions holds one row per routed position (dataset, version, event key): the first
--     event routed there. Any later event at that position, from any producer, is stored for audit
--     and marked `Duplicate`, creating nothing.

ALTER TABLE dataset_versions ADD COLUMN current_since timestamptz;
ALTER TABLE dataset_versions ADD COLUMN became_current text
    CHECK (became_current IN ('created', 'rollback'));
UPDATE dataset_versions SET current_since = created_at, became_current = 'created';
ALTER TABLE dataset_versions ALTER COLUMN current_since SET NOT NULL;
ALTER TABLE dataset_versions ALTER COLUMN became_current SET NOT NULL;

ALTER TABLE task_events DROP CONSTRAINT task_events_route_reason_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_route_reason_check
    CHECK (route_reason IN ('NotCurrentVersion', 'UnknownDataset', 'Duplicate'));

CREATE TABLE event_positions (
    dataset_uuid      uuid NOT NULL,
    dataset_version   uuid NOT NULL,
    event_key         text NOT NULL,
    -- The event routed at this position; later events there are `Duplicate`.
    event_id          bigint NOT NULL,
    PRIMARY KEY (dataset_uuid, dataset_version, event_key)
);

INSERT INTO event_positions (dataset_uuid, dataset_version, event_key, event_id)
SELECT DISTINCT ON (dataset_uuid, dataset_version, event_key)
       dataset_uuid, dataset_version, event_key, event_id
FROM task_events
WHERE routed_at IS NOT NULL AND route_reason IS NULL
ORDER BY dataset_uuid, dataset_version, event_key, event_id;

-- The (dataset_uuid, dataset_version) pairs a task's inputs pin: each object entry naming both.
CREATE FUNCTION taskplat_input_pins(p_inputs jsonb)
RETURNS TABLE (dataset_uuid uuid, dataset_version uuid)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT DISTINCT (i ->> 'dataset_uuid')::uuid, (i ->> 'dataset_version')::uuid
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_inputs) = 'array' THEN p_inputs
                                   ELSE '[]'::jsonb END) AS i
    WHERE jsonb_typeof(i) = 'object'
      AND jsonb_typeof(i -> 'dataset_uuid') = 'string'
      AND jsonb_typeof(i -> 'dataset_version') = 'string'
$$;

-- Make `p_version` the dataset's current version: a new one (`p_how` = 'created', inserted
-- here) or an existing earlier one ('rollback'). The version that stops being current is marked
-- superseded; every live task pinned to another version of the dataset is canceled
-- (VersionSuperseded, its open attempt closed) and returned. A buffered dataset restored to an
-- earlier version names that version's table again. The caller holds the dataset row FOR UPDATE.
CREATE FUNCTION taskplat_make_version_current(
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
    WITH canceled AS (
        UPDATE tasks AS t
        SET status = 'Canceled',
            cancel_reason = 'VersionSuperseded',
            attempt_outcome = CASE WHEN t.status = 'Running' THEN 'Canceled'
                                   ELSE t.attempt_outcome END,
            next_retry_at = NULL,
            lease_expires_at = NULL,
            finished_at = p_now,
            updated_at = p_now
        WHERE t.task_id = ANY (ARRAY(
                  SELECT p.task_id FROM task_pins AS p
                  WHERE p.dataset_uuid = p_dataset_uuid AND p.dataset_version <> p_version))
          AND t.status IN ('Scheduled', 'Queued', 'Failed', 'Running')
        RETURNING t.task_id, t.attempt, t.queue, t.operator, t.worker_id
    ),
    closed AS (
        UPDATE task_attempts AS a
        SET outcome = 'Canceled', finished_at = p_now
        FROM canceled AS c
        WHERE a.task_id = c.task_id AND a.attempt = c.attempt AND a.outcome IS NULL
    )
    SELECT c.task_id, c.attempt, c.queue, c.operator, c.worker_id FROM canceled AS c;
END
$$;

-- A task's inputs with every entry that names a dataset version moved to its dataset's current
-- version (entries of unknown datasets and other entries unchanged).
CREATE FUNCTION taskplat_repinned_inputs(p_inputs jsonb) RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(jsonb_agg(
               CASE WHEN d.dataset_uuid IS NULL THEN x.e
                    ELSE jsonb_set(x.e, '{dataset_version}', to_jsonb(d.current_version::text))
               END ORDER BY x.ord), '[]'::jsonb)
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_inputs) = 'array' THEN p_inputs
                                   ELSE '[]'::jsonb END) WITH ORDINALITY AS x(e, ord)
    LEFT JOIN datasets AS d
           ON jsonb_typeof(x.e) = 'object'
          AND jsonb_typeof(x.e -> 'dataset_version') = 'string'
          AND d.dataset_uuid::text = lower(x.e ->> 'dataset_uuid')
$$;

-- The pin check of a replay, for the tasks among `p_task_ids` that are Dead or Canceled (locked
-- here FOR UPDATE): the datasets they are pinned to are share-locked first, so the current
-- versions read next are the latest committed ones and cannot change before the caller commits.
-- Without `p_repin`, returns the tasks pinned to a version that is no longer current (the caller
-- refuses to replay them: PinnedVersionNotCurrent). With it, re-pins those tasks to the current
-- versions (inputs and pins) and returns nothing.
CREATE FUNCTION taskplat_replay_pins(p_task_ids uuid[], p_repin boolean)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    stale uuid[];
BEGIN
    PERFORM 1 FROM tasks AS t
    WHERE t.task_id = ANY (p_task_ids) AND t.status IN ('Dead', 'Canceled')
    ORDER BY t.task_id
    FOR UPDATE;
    PERFORM 1 FROM datasets AS d
    WHERE d.dataset_uuid IN (SELECT p.dataset_uuid FROM task_pins AS p
                             WHERE p.task_id = ANY (p_task_ids))
    ORDER BY d.dataset_uuid
    FOR SHARE;
    stale := ARRAY(
        SELECT DISTINCT p.task_id
        FROM task_pins AS p
        JOIN tasks AS t ON t.task_id = p.task_id
        JOIN datasets AS d ON d.dataset_uuid = p.dataset_uuid
        WHERE p.task_id = ANY (p_task_ids)
          AND t.status IN ('Dead', 'Canceled')
          AND p.dataset_version <> d.current_version);
    IF NOT p_repin THEN
        RETURN QUERY SELECT unnest(stale);
        RETURN;
    END IF;
    UPDATE tasks AS t SET inputs = taskplat_repinned_inputs(t.inputs)
    WHERE t.task_id = ANY (stale);
    DELETE FROM task_pins AS p WHERE p.task_id = ANY (stale);
    INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
    SELECT i.dataset_uuid, i.dataset_version, t.task_id
    FROM tasks AS t, taskplat_input_pins(t.inputs) AS i
    WHERE t.task_id = ANY (stale)
    ON CONFLICT DO NOTHING;
    RETURN;
END
$$;

-- A job run's pins come from taskplat_input_pins, like every other task's.
CREATE OR REPLACE FUNCTION taskplat_start_job_run(
    p_dag_name text,
    p_job_name text,
    p_inputs jsonb,
    p_extra_config jsonb,
    p_idempotency_key text,
    p_now timestamptz,
    p_trace_context jsonb,
    p_task_id uuid DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid := coalesce(p_task_id, gen_random_uuid());
    j jobs%ROWTYPE;
BEGIN
    SELECT * INTO j FROM jobs WHERE dag_name = p_dag_name AND name = p_job_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO tasks (
        task_id, status, queue, operator, job, config, inputs, max_attempts,
        backoff_base_seconds, backoff_max_seconds, timeout_seconds, idempotency_key, queued_at,
        created_at, updated_at)
    VALUES (
        new_id, 'Queued', j.queue, j.operator,
        jsonb_build_object('dag_name', j.dag_name, 'name', j.name),
        j.config || coalesce(p_extra_config, '{}'::jsonb), coalesce(p_inputs, '[]'::jsonb),
        j.max_attempts, j.backoff_base_seconds, j.backoff_max_seconds, j.timeout_seconds,
        p_idempotency_key, p_now, p_now, p_now)
    ON CONFLICT (idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
    SELECT i.dataset_uuid, i.dataset_version, new_id
    FROM taskplat_input_pins(coalesce(p_inputs, '[]'::jsonb)) AS i;
    INSERT INTO outbox (kind, task_id, queue, payload, trace_context, created_at, available_at)
    VALUES ('enqueue_task', new_id, j.queue, jsonb_build_object('task_id', new_id::text),
            p_trace_context, p_now, p_now);
    RETURN new_id;
END
$$;
