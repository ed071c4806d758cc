-- Buffered Postgres datasets and step results (docs/contracts.md "Buffered Postgres datasets",
-- docs/ARCHITECTURE.md "Step results").
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

-- The sink's database role: NOLOGIN, granted by a deployment to the sink's login user. It may read
-- the buffered datasets' rows, record their queue URLs, write the dataset tables (each table grants
-- it SELECT and INSERT when the dispatcher creates it), and lock a table's row and store a dataset
-- event only through the two functions below; nothing else of the platform's (no tasks, no outbox,
-- no DDL). Created when the migrating user may create roles; otherwise create it by hand
-- (docs/deploy.md) and re-run the GRANTs below.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_sink') THEN
        CREATE ROLE taskplat_sink NOLOGIN;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'role taskplat_sink not created (no CREATEROLE); create it by hand';
    WHEN duplicate_object OR unique_violation THEN
        NULL;  -- created meanwhile by a migration of another database of the cluster
END
$$;

-- The current version's table of a buffered dataset, with its row locked for the caller's
-- transaction (one writer per dataset) and the dataset row share-locked (no rollover meanwhile).
CREATE FUNCTION taskplat_sink_lock_table(p_dataset_uuid uuid)
RETURNS TABLE (dataset_version uuid, table_name text, columns jsonb, schema_hash text)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
    SELECT d.current_version, t.table_name, t.columns, t.schema_hash
    FROM datasets AS d
    JOIN dataset_tables AS t
      ON t.dataset_uuid = d.dataset_uuid AND t.dataset_version = d.current_version
    JOIN dataset_buffers AS b ON b.dataset_uuid = d.dataset_uuid
    WHERE d.dataset_uuid = p_dataset_uuid
    FOR SHARE OF d
    FOR UPDATE OF t
$$;

-- Store a buffered dataset's event under its producer task (the trigger adds the route_event
-- row); nothing for a dataset that is not buffered, or an event already stored.
CREATE FUNCTION taskplat_sink_store_event(
    p_dataset_uuid uuid, p_dataset_version uuid, p_cursor bigint, p_now timestamptz
) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
    WITH stored AS (
        INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor",
                                 created_at)
        SELECT b.producer_task_id, 1, b.dataset_uuid, p_dataset_version, p_cursor,
               coalesce(p_now, now())
        FROM dataset_buffers AS b
        WHERE b.dataset_uuid = p_dataset_uuid
        ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM stored
$$;

-- Create a dataset table. The services' role holds no DDL rights (docs/deploy.md), so the
-- dispatcher creates tables only through this function, which runs as the schema owner and accepts
-- nothing but a dataset table name and columns of the allow-list (the same rules as
-- taskplat.common.buffered): row_id identity (the event cursor), org_id and dedupe_key NOT NULL,
-- UNIQUE (org_id, dedupe_key). Identifiers are quoted with format('%I'); a type is one of the
-- allow-list's literals. It grants SELECT and INSERT on the table to taskplat_sink when that role
-- exists, and the services' usual rights come from the owner's default privileges.
CREATE FUNCTION taskplat_create_dataset_table(p_table text, p_columns jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    allowed constant text[] := ARRAY['text', 'bigint', 'integer', 'smallint', 'boolean',
        'double precision', 'real', 'numeric', 'jsonb', 'uuid', 'timestamptz', 'date'];
    column_def record;
    definitions text[] := ARRAY['row_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY'];
BEGIN
    IF p_table !~ '^dataset_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(_v[0-9]{1,6})?$'
    THEN
        RAISE EXCEPTION 'not a dataset table name: %', p_table USING ERRCODE = '22023';
    END IF;
    FOR column_def IN
        SELECT c ->> 'name' AS name, c ->> 'type' AS type
        FROM jsonb_array_elements(p_columns) WITH ORDINALITY AS e(c, n) ORDER BY n
    LOOP
        IF column_def.name !~ '^[a-z_][a-z0-9_]{0,62}$' OR column_def.name = 'row_id'
           OR NOT column_def.type = ANY (allowed) THEN
            RAISE EXCEPTION 'column % % is not allowed', column_def.name, column_def.type
                USING ERRCODE = '22023';
        END IF;
        definitions := definitions || (format('%I', column_def.name) || ' ' || column_def.type
            || CASE WHEN column_def.name IN ('org_id', 'dedupe_key') THEN ' NOT NULL' ELSE '' END);
    END LOOP;
    definitions := definitions || 'UNIQUE (org_id, dedupe_key)'::text;
    EXECUTE format('CREATE TABLE %I (%s)', p_table, array_to_string(definitions, ', '));
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_sink') THEN
        EXECUTE format('GRANT SELECT, INSERT ON %I TO taskplat_sink', p_table);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION taskplat_sink_lock_table(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION taskplat_sink_store_event(uuid, uuid, bigint, timestamptz) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_sink') THEN
        GRANT SELECT (dataset_uuid, queue_url, dlq_url) ON dataset_buffers TO taskplat_sink;
        GRANT UPDATE (queue_url, dlq_url, ready_at) ON dataset_buffers TO taskplat_sink;
        GRANT EXECUTE ON FUNCTION taskplat_sink_lock_table(uuid) TO taskplat_sink;
        GRANT EXECUTE ON FUNCTION taskplat_sink_store_event(uuid, uuid, bigint, timestamptz)
            TO taskplat_sink;
    END IF;
END
$$;
