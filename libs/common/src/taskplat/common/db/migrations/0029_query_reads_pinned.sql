-- The query service reads exactly what a running attempt pinned (docs/security.md, "Query
-- Service").
--
-- Invariants:
--   * `taskplat_query` holds no right on any table: the SELECT grants of migration 0019 on the
--     dataset tables are revoked, and new dataset tables grant it nothing. Its members may call
--     `taskplat_query_inputs` and `taskplat_query_open`, and nothing else of the platform's.
--   * Both answer only for an attempt that is running now: the task is Running at that attempt
--     and its inputs pin that (dataset, version). A token of another task, of an attempt that
--     ended, or naming a version its task did not pin reads nothing, whatever the token says:
--     a query service that misbehaves reaches the pins of running attempts, not every dataset.
--   * `taskplat_query_open` opens a cursor on the pinned version's table as the schema owner
--     (the privileges are checked when the cursor opens, inside the function); the caller FETCHes
--     it in the same transaction. It answers NULL when the attempt may not read that version.

DROP FUNCTION taskplat_query_inputs(uuid[], uuid[]);

-- The pinned inputs an attempt running now may read: one row per (dataset, version) pair given
-- that its task pins and that exists, with the dataset's name and kind and, for a Postgres
-- dataset, the table of that version (a buffered dataset's version table; a `postgres`
-- dataset's location template filled in), else NULL.
CREATE FUNCTION taskplat_query_inputs(
    p_task_id uuid, p_attempt integer, p_datasets uuid[], p_versions uuid[]
)
RETURNS TABLE (dataset_uuid uuid, dataset_version uuid, name text, kind text, table_name text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL, not SQL: its plan is kept for the session (a SQL function that is not inlined,
    -- as a SECURITY DEFINER one never is, is planned again on every call).
    RETURN QUERY
    SELECT d.dataset_uuid, v.dataset_version, d.name, d.kind,
           CASE d.kind
               WHEN 'buffered_postgres' THEN t.table_name
               WHEN 'postgres' THEN CASE WHEN d.location LIKE 'postgres_table:%'
                   THEN replace(replace(substr(d.location, length('postgres_table:') + 1),
                        '{dataset_uuid}', d.dataset_uuid::text),
                        '{dataset_version}', v.dataset_version::text) END
           END
    FROM tasks AS task
    CROSS JOIN LATERAL taskplat_input_pins(task.inputs) AS pin
    JOIN unnest(p_datasets, p_versions) AS p(dataset_uuid, dataset_version)
      ON p.dataset_uuid = pin.dataset_uuid AND p.dataset_version = pin.dataset_version
    JOIN datasets AS d ON d.dataset_uuid = p.dataset_uuid
    JOIN dataset_versions AS v
      ON v.dataset_uuid = p.dataset_uuid AND v.dataset_version = p.dataset_version
    LEFT JOIN dataset_tables AS t
      ON t.dataset_uuid = v.dataset_uuid AND t.dataset_version = v.dataset_version
    WHERE task.task_id = p_task_id AND task.status = 'Running' AND task.attempt = p_attempt;
END
$$;

-- A cursor over the whole table of one pinned version, for an attempt running now that pins it
-- (`taskplat_query_inputs`); NULL otherwise. FETCH it in the calling transaction.
CREATE FUNCTION taskplat_query_open(
    p_task_id uuid, p_attempt integer, p_dataset uuid, p_version uuid
)
RETURNS refcursor
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_table text;
    v_cursor refcursor;
BEGIN
    SELECT i.table_name INTO v_table
    FROM taskplat_query_inputs(p_task_id, p_attempt, ARRAY[p_dataset], ARRAY[p_version]) AS i;
    IF v_table IS NULL THEN
        RETURN NULL;
    END IF;
    OPEN v_cursor NO SCROLL FOR EXECUTE format('SELECT * FROM %I', v_table);
    RETURN v_cursor;
END
$$;

REVOKE ALL ON FUNCTION taskplat_query_inputs(uuid, integer, uuid[], uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION taskplat_query_open(uuid, integer, uuid, uuid) FROM PUBLIC;

-- As in 0019, without the grant to taskplat_query.
CREATE OR REPLACE FUNCTION taskplat_create_dataset_table(p_table text, p_columns jsonb) RETURNS void
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

DO $$
DECLARE
    existing record;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_query') THEN
        GRANT EXECUTE ON FUNCTION taskplat_query_inputs(uuid, integer, uuid[], uuid[])
            TO taskplat_query;
        GRANT EXECUTE ON FUNCTION taskplat_query_open(uuid, integer, uuid, uuid)
            TO taskplat_query;
        FOR existing IN
            SELECT c.relname AS table_name
            FROM pg_class AS c
            JOIN pg_namespace AS n ON n.oid = c.relnamespace
            WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
              AND has_table_privilege('taskplat_query', c.oid, 'SELECT')
        LOOP
            EXECUTE format('REVOKE ALL ON %I FROM taskplat_query', existing.table_name);
        END LOOP;
    END IF;
END
$$;
