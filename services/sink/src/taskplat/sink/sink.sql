-- The sink's reads and writes (docs/contracts.md "Buffered Postgres datasets"). Time is
-- coalesce(%(now)s::timestamptz, now()).

-- name: buffers
-- Every buffered dataset's buffer (queue URLs NULL until the sink created them).
SELECT dataset_uuid, queue_url, dlq_url FROM dataset_buffers ORDER BY dataset_uuid

-- name: set_queue_urls
UPDATE dataset_buffers
SET queue_url = %(queue_url)s, dlq_url = %(dlq_url)s,
    ready_at = coalesce(%(now)s::timestamptz, now())
WHERE dataset_uuid = %(dataset_uuid)s AND queue_url IS NULL

-- name: lock_current_table
-- The dataset's current version and its table, locked for this write (taskplat_sink_lock_table):
-- one sink at a time writes a dataset, so its cursor (the table's high mark) only grows and every
-- row up to a stored event's cursor is committed when the event is. A rollover (FOR UPDATE of the
-- dataset row) waits for this transaction, and this one for it.
SELECT dataset_version, table_name, columns, schema_hash
FROM taskplat_sink_lock_table(%(dataset_uuid)s)

-- name: store_event
-- The write's event, under the dataset's producer task (taskplat_sink_store_event); its
-- route_event outbox row comes from the task_events trigger in this same transaction.
SELECT taskplat_sink_store_event(%(dataset_uuid)s, %(dataset_version)s, %(cursor)s,
                                 %(now)s::timestamptz) AS stored
