-- Rows the sink tests read.

-- name: dataset_events
SELECT e.event_id, e."cursor", e.task_id, e.dataset_version,
       (SELECT count(*) FROM outbox AS o
        WHERE o.kind = 'route_event' AND (o.payload ->> 'event_id')::bigint = e.event_id)
           AS route_rows
FROM task_events AS e
WHERE e.dataset_uuid = %(dataset_uuid)s
ORDER BY e.event_id
