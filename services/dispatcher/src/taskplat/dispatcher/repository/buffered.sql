-- Buffered Postgres datasets: their tables, buffers and sink producer tasks (docs/contracts.md
-- "Buffered Postgres datasets"). Callers hold the dataset row's lock (`dags.lock_dataset`) for every write.
-- Time is coalesce(%(now)s::timestamptz, now()).

-- name: current_table
SELECT t.dataset_version, t.ordinal, t.table_name, t.columns, t.schema_hash
FROM dataset_tables AS t
JOIN datasets AS d
  ON d.dataset_uuid = t.dataset_uuid AND d.current_version = t.dataset_version
WHERE t.dataset_uuid = %(dataset_uuid)s

-- name: add_table
-- The table of a buffered dataset's version: created, recorded, named by the dataset's location,
-- with the dataset's buffer row (taskplat_add_dataset_table, migration 0022). Returns its name.
SELECT taskplat_add_dataset_table(%(dataset_uuid)s::uuid, %(dataset_version)s::uuid,
                                  %(columns)s::jsonb, %(schema_hash)s::text,
                                  %(now)s::timestamptz) AS table_name

-- name: buffered_view
SELECT t.columns, t.schema_hash, t.table_name, b.queue_url
FROM datasets AS d
JOIN dataset_tables AS t
  ON t.dataset_uuid = d.dataset_uuid AND t.dataset_version = d.current_version
LEFT JOIN dataset_buffers AS b ON b.dataset_uuid = d.dataset_uuid
WHERE d.dataset_uuid = %(dataset_uuid)s
