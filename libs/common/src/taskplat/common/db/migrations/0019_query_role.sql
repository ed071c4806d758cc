-- The query service's database role (docs/security.md, "Query Service").
--
-- Invariants:
--   * `taskplat_query` is NOLOGIN, granted by a deployment to the query service's login user. It
--     may SELECT the dataset tables and call `taskplat_query_inputs`, and nothing else of the
--     platform's: no tasks, no outbox, no catalog tables, no writes, no DDL.
--   * every dataset table the platform creates grants it SELECT in the same transaction
--     (`taskplat_create_dataset_table`, replaced below), and the tables that exist already are
--     granted here: there is no window in which a buffered dataset is unreadable. Default
--     privileges are deliberately not used: they would also cover the platform's own tables
--     created by later migrations. A `postgres` dataset's table is created by its producer, who
--     grants it (`GRANT SELECT ON <table> TO taskplat_query`, docs/deploy.md).
--   * `taskplat_query_inputs` answers, for pinned (dataset, version) pairs, only the name, kind
--     and table of each; it runs as the schema owner, so the role needs no right on `datasets`
--     or `dataset_tables` themselves.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_query') THEN
        CREATE ROLE taskplat_query NOLOGIN;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'role taskplat_query not created (no CREATEROLE); create it by hand';
    WHEN duplicate_object OR unique_violation THEN
        NULL;  -- created meanwhile by a migration of another database of the cluster
END
$$;

-- The pinned inputs of a capability: one row per (dataset, version) pair given that exists, with
-- the dataset's name and kind and, for a Postgres dataset, the table of that version (a buffered
-- dataset's version table; a `postgres` dataset's location template filled in), else NULL.
CREATE FUNCTION taskplat_query_inputs(p_datasets uuid[], p_versions uuid[])
RETURNS TABLE (dataset_uuid uuid, dataset_version uuid, name text, kind text, table_name text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
    SELECT d.dataset_uuid, v.dataset_version, d.name, d.kind,
           CASE d.kind
               WHEN 'buffered_postgres' THEN t.table_name
               WHEN 'postgres' THEN CASE WHEN d.location LIKE 'postgres_table:%'
                   THEN replace(replace(substr(d.location, length('postgres_table:') + 1),
                        '{dataset_uuid}', d.dataset_uuid::text),
                        '{dataset_version}', v.dataset_version::text) END
           END
    FROM unnest(p_datasets, p_versions) AS p(dataset_uuid, dataset_version)
    JOIN datasets AS d ON d.dataset_uuid = p.dataset_uuid
    JOIN dataset_versions AS v
      ON v.dataset_uuid = p.dataset_uuid AND v.dataset_version = p.dataset_version
    LEFT JOIN dataset_tables AS t
      ON t.dataset_uuid = v.dataset_uuid AND t.dataset_version = v.dataset_version
$$;

REVOKE ALL ON FUNCTION taskplat_query_inputs(uuid[], uuid[]) FROM PUBLIC;

-- As in 0009, plus: the new table grants SELECT to taskplat_query when that role exists.
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
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_query') THEN
        EXECUTE format('GRANT SELECT ON %I TO taskplat_query', p_table);
    END IF;
END
$$;

DO $$
DECLARE
    existing record;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'taskplat_query') THEN
        GRANT EXECUTE ON FUNCTION taskplat_query_inputs(uuid[], uuid[]) TO taskplat_query;
        FOR existing IN SELECT t.table_name FROM dataset_tables AS t LOOP
            EXECUTE format('GRANT SELECT ON %I TO taskplat_query', existing.table_name);
        END LOOP;
    END IF;
END
$$;
