-- Buffered Postgres datasets: their tables, buffers and sink producer tasks (docs/contracts.md
-- "Buffered Postgres datasets"). Callers hold the dataset row's lock (`dags.lock_dataset`) for every write.
-- Time is coalesce(%(now)s::timestamptz, now()).

-- name: current_table
SELECT t.dataset_version, t.ordinal, t.table_name, t.columns, t.schema_hash
FROM dataset_tables AS t
JOIN datasets AS d
  ON d.dataset_uuid = t.dataset_uuid AND d.current_version = t.dataset_version
WHERE t.dataset_uuid = %(dataset_uuid)s

-- name: next_ordinal
SELECT coalesce(max(ordinal), 0) + 1 AS ordinal
FROM dataset_tables
WHERE dataset_uuid = %(dataset_uuid)s

-- name: insert_table
INSERT INTO dataset_tables (dataset_uuid, dataset_version, ordinal, table_name, columns,
                            schema_hash, created_at)
VALUES (%(dataset_uuid)s, %(dataset_version)s, %(ordinal)s, %(table_name)s, %(columns)s,
        %(schema_hash)s, coalesce(%(now)s::timestamptz, now()))

-- name: set_location
UPDATE datasets
SET location = %(location)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE dataset_uuid = %(dataset_uuid)s

-- name: ensure_buffer
-- The dataset's buffer row and the task its sink events are stored under (Completed, never
-- finished: retention keeps it). Nothing when the buffer exists.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
fresh AS (
    SELECT gen_random_uuid() AS task_id
    WHERE NOT EXISTS (SELECT 1 FROM dataset_buffers WHERE dataset_uuid = %(dataset_uuid)s)
),
task AS (
    INSERT INTO tasks (task_id, status, queue, operator, config, max_attempts,
                       backoff_base_seconds, backoff_max_seconds, attempt_outcome, created_at,
                       updated_at)
    SELECT f.task_id, 'Completed', 'default', 'taskplat.sink',
           jsonb_build_object('dataset_uuid', %(dataset_uuid)s::text), 1, 0, 0, 'Completed',
           n.now, n.now
    FROM fresh AS f, n
    RETURNING task_id
)
INSERT INTO dataset_buffers (dataset_uuid, producer_task_id, created_at)
SELECT %(dataset_uuid)s, t.task_id, n.now FROM task AS t, n

-- name: buffered_view
SELECT t.columns, t.schema_hash, t.table_name, b.queue_url
FROM datasets AS d
JOIN dataset_tables AS t
  ON t.dataset_uuid = d.dataset_uuid AND t.dataset_version = d.current_version
LEFT JOIN dataset_buffers AS b ON b.dataset_uuid = d.dataset_uuid
WHERE d.dataset_uuid = %(dataset_uuid)s

-- name: create_table
SELECT taskplat_create_dataset_table(%(table_name)s, %(columns)s)
