-- A normalized description of the public schema, for the migration snapshot test. Each query
-- returns rows in a stable order and nothing that differs between two databases of one schema
-- (no OIDs, no database names, no data but the applied migration versions).

-- name: columns
SELECT c.table_name, t.table_type, c.column_name, c.ordinal_position, c.data_type, c.udt_name,
       c.is_nullable, c.column_default, c.is_identity, c.identity_generation, c.is_generated,
       c.generation_expression
FROM information_schema.columns AS c
JOIN information_schema.tables AS t
  ON t.table_schema = c.table_schema AND t.table_name = c.table_name
WHERE c.table_schema = 'public'
ORDER BY c.table_name, c.ordinal_position

-- name: indexes
SELECT tablename, indexname, indexdef
FROM pg_indexes
WHERE schemaname = 'public'
ORDER BY tablename, indexname

-- name: constraints
SELECT conrelid::regclass::text AS table_name, conname, contype::text AS contype,
       pg_get_constraintdef(oid) AS definition
FROM pg_constraint
WHERE connamespace = 'public'::regnamespace
ORDER BY 1, 2

-- name: functions
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result, p.provolatile::text AS volatility,
       p.proparallel::text AS parallel, pg_get_functiondef(p.oid) AS definition
FROM pg_proc AS p
WHERE p.pronamespace = 'public'::regnamespace
ORDER BY 1, 2

-- name: views
SELECT viewname, definition
FROM pg_views
WHERE schemaname = 'public'
ORDER BY viewname

-- name: sequences
-- pg_sequence, not information_schema.sequences: the latter omits identity columns' sequences.
SELECT c.relname AS sequence_name, format_type(s.seqtypid, NULL) AS data_type,
       s.seqstart AS start_value, s.seqincrement AS increment, s.seqcycle AS cycles
FROM pg_sequence AS s
JOIN pg_class AS c ON c.oid = s.seqrelid
WHERE c.relnamespace = 'public'::regnamespace
ORDER BY 1

-- name: triggers
SELECT event_object_table, trigger_name, event_manipulation, action_timing, action_statement
FROM information_schema.triggers
WHERE trigger_schema = 'public'
ORDER BY 1, 2, 3

-- name: migrations
SELECT version, name
FROM schema_migrations
ORDER BY version
