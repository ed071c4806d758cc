-- Buffered Postgres datasets and step results (DESIGN "Buffered Postgres datasets", "Step results").
--
-- Invariants:
--   * a buffered_postgres dataset has one `dataset_tables` row per version: the table the
--     platform created for it (`dataset_{dataset_uuid}` for the first version,
--     `dataset_{dataset_uuid}_v{n}` for later ones), the declared schema and its hash. A table is
--     created once, in the transaction that creates its version, and never altered: a changed
--     schema is a new version with a new table;
--   * every dataset table has `row_id` (identity, the cursor of its events), `org_id uuid`,
--     `dedupe_key text`, the declared columns and UNIQUE (org_id, dedupe_key);
--   * `dataset_buffers` has one row per buffered dataset: its queue URLs stay NULL until the sink
--     has created the buffer queue and its DLQ (the dataset view shows null meanwhile), and
--     `producer_task_id` names the task row the sink's events are stored under. That task is
--     Completed with no finished_at, so retention never prunes it (nor, through the cascade, the
--     dataset's events);
--   * a step's first recorded result wins: (task_id, step) is the primary key and a later insert
--     does nothing.

CREATE TABLE dataset_buffers (
    dataset_uuid      uuid PRIMARY KEY REFERENCES datasets (dataset_uuid),
    producer_task_id  uuid NOT NULL REFERENCES tasks (task_id),
    queue_url         text,
    dlq_url           text,
    created_at        timestamptz NOT NULL,
    ready_at          timestamptz,
    CHECK ((queue_url IS NULL) = (ready_at IS NULL))
);

CREATE TABLE dataset_tables (
    dataset_uuid      uuid NOT NULL,
    dataset_version   uuid NOT NULL,
    ordinal           integer NOT NULL CHECK (ordinal >= 1),
    table_name        text NOT NULL UNIQUE,
    -- The full column list [{name, type}], org_id and dedupe_key first.
    columns           jsonb NOT NULL,
    schema_hash       text NOT NULL,
    created_at        timestamptz NOT NULL,
    PRIMARY KEY (dataset_uuid, dataset_version),
    UNIQUE (dataset_uuid, ordinal),
    FOREIGN KEY (dataset_uuid, dataset_version)
        REFERENCES dataset_versions (dataset_uuid, dataset_version)
);

CREATE TABLE task_steps (
    task_id           uuid NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    step              text NOT NULL,
    attempt           integer NOT NULL,
    result            jsonb NOT NULL,
    created_at        timestamptz NOT NULL,
    PRIMARY KEY (task_id, step)
);

-- The step results a task's earlier attempts recorded, {step: result}, as a claim hands them to
-- the worker (empty for a first attempt: nothing to look up).
CREATE FUNCTION taskplat_task_steps(p_task_id uuid, p_attempt integer) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_attempt <= 1 THEN '{}'::jsonb ELSE coalesce((
        SELECT jsonb_object_agg(s.step, s.result) FROM task_steps AS s
        WHERE s.task_id = p_task_id), '{}'::jsonb) END
$$;

-- The outputs of a job as a claim hands them to the worker (0005), plus each output's dataset
-- name and kind, and for a buffered_postgres output its schema hash and buffer queue URL (null
-- until the sink created the queue).
CREATE OR REPLACE FUNCTION taskplat_job_outputs(job jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN job IS NULL THEN '[]'::jsonb ELSE coalesce((
        SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                   'output_index', o.output_index,
                   'dataset_uuid', d.dataset_uuid,
                   'dataset_version', d.current_version,
                   'dataset', d.name,
                   'kind', d.kind,
                   'location', replace(replace(d.location,
                       '{dataset_uuid}', d.dataset_uuid::text),
                       '{dataset_version}', d.current_version::text),
                   'schema_hash', t.schema_hash,
                   'buffer_queue_url', b.queue_url))
               ORDER BY o.output_index)
        FROM job_outputs AS o
        JOIN datasets AS d ON d.dataset_uuid = o.dataset_uuid
        LEFT JOIN dataset_tables AS t
               ON t.dataset_uuid = d.dataset_uuid AND t.dataset_version = d.current_version
        LEFT JOIN dataset_buffers AS b ON b.dataset_uuid = d.dataset_uuid
        WHERE o.dag_name = job ->> 'dag_name' AND o.job_name = job ->> 'name'), '[]'::jsonb) END
$$;
