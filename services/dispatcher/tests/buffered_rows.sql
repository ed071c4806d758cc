-- Rows the buffered dataset tests read.

-- name: table_columns
SELECT column_name, data_type
FROM information_schema.columns
WHERE table_name = %(table_name)s
ORDER BY ordinal_position

-- name: dataset_tables
SELECT dataset_version, ordinal, table_name, schema_hash
FROM dataset_tables
WHERE dataset_uuid = %(dataset_uuid)s
ORDER BY ordinal
