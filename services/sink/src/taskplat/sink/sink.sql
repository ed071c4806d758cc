-- The sink's reads and writes (DESIGN "Buffered Postgres datasets"). Time is
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
-- The dataset's current version and its table, locked for this write: one sink at a time writes
-- a dataset, so its cursor (the table's high mark) only grows and every row up to a stored
-- event's cursor is committed when the event is. A rollover (FOR UPDATE of the dataset row) waits
-- for this transaction, and this one for it.
SELECT d.current_version AS dataset_version, t.table_name, t.columns, t.schema_hash,
       b.producer_task_id
FROM datasets AS d
JOIN dataset_tables AS t
  ON t.dataset_uuid = d.dataset_uuid AND t.dataset_version = d.current_version
JOIN dataset_buffers AS b ON b.dataset_uuid = d.dataset_uuid
WHERE d.dataset_uuid = %(dataset_uuid)s
FOR SHARE OF d
FOR UPDATE OF t

-- name: store_event
-- The write's event, under the dataset's producer task; its route_event outbox row comes from
-- the task_events trigger in this same transaction.
INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, "cursor", created_at)
VALUES (%(task_id)s, 1, %(dataset_uuid)s, %(dataset_version)s, %(cursor)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (task_id, dataset_uuid, dataset_version, event_key) DO NOTHING
