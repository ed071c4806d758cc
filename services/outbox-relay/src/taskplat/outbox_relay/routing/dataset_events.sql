-- Routing of stored events to the jobs that read their dataset (docs/contracts.md "Events and routing").
--
-- The relay runs these inside the transaction that holds the events' `route_event` outbox rows:
-- the downstream tasks, their wake-ups, the route keys and the events' routed marks commit
-- together with the outbox rows marked sent, or not at all. Time is
-- coalesce(%(now)s::timestamptz, now()).

-- name: lock_event_datasets
-- Share-lock the datasets of the events (a change of the current version, new or rollback, locks
-- the row for update), so the current version read by route_events, a later statement of this
-- transaction, is the latest committed one and stays current until this transaction ends.
SELECT d.dataset_uuid
FROM datasets AS d
WHERE d.dataset_uuid = ANY (ARRAY(
          SELECT e.dataset_uuid FROM task_events AS e
          WHERE e.event_id = ANY (%(event_ids)s::bigint[])))
ORDER BY d.dataset_uuid
FOR SHARE

-- name: route_events
-- Decide each unrouted event: an unknown dataset or a version that is not current creates
-- nothing; an event of the current version claims its position (event_positions: the first event
-- routed at a dataset version's position, from any producer) or, when another event holds it, is
-- a Duplicate and creates nothing. An event that claimed its position gets one route key per
-- consuming job, written only when no event at the same position was routed to that job before
-- (ON CONFLICT DO NOTHING: exactly one task per job, dataset, version and position). Marks every
-- event routed. Returns one row per new route (with the job's input for the task), plus one row
-- with NULL job per event that created nothing.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
locked AS MATERIALIZED (
    SELECT e.event_id, e.dataset_uuid, e.dataset_version, e."cursor", e.partition_key,
           e.range_start, e.range_end, e.event_key, e.created_at,
           CASE WHEN d.dataset_uuid IS NULL THEN 'UnknownDataset'
                WHEN d.current_version <> e.dataset_version THEN 'NotCurrentVersion'
           END AS reason
    FROM task_events AS e
    LEFT JOIN datasets AS d ON d.dataset_uuid = e.dataset_uuid
    WHERE e.event_id = ANY (%(event_ids)s::bigint[])
      AND e.routed_at IS NULL
    FOR UPDATE OF e
),
positions AS (
    INSERT INTO event_positions (dataset_uuid, dataset_version, event_key, event_id)
    SELECT l.dataset_uuid, l.dataset_version, l.event_key, l.event_id
    FROM locked AS l
    WHERE l.reason IS NULL
    ORDER BY l.event_id
    ON CONFLICT DO NOTHING
    RETURNING event_id
),
ev AS MATERIALIZED (
    SELECT l.event_id, l.dataset_uuid, l.dataset_version, l."cursor", l.partition_key,
           l.range_start, l.range_end, l.event_key, l.created_at,
           CASE WHEN l.reason IS NOT NULL THEN l.reason
                WHEN NOT EXISTS (SELECT 1 FROM positions AS p WHERE p.event_id = l.event_id)
                    THEN 'Duplicate'
           END AS reason
    FROM locked AS l
),
targets AS (
    SELECT DISTINCT ON (ev.event_id, i.dag_name, i.job_name)
           ev.event_id, ev.dataset_uuid, ev.dataset_version, ev.event_key, i.dag_name,
           i.job_name,
           jsonb_strip_nulls(jsonb_build_object(
               'dataset_uuid', ev.dataset_uuid, 'dataset_version', ev.dataset_version,
               'cursor', ev."cursor", 'partition_key', ev.partition_key,
               'start', ev.range_start, 'end', ev.range_end, 'where', i.where_clause)) AS input
    FROM ev
    JOIN job_inputs AS i ON i.dataset_uuid = ev.dataset_uuid
    WHERE ev.reason IS NULL
    ORDER BY ev.event_id, i.dag_name, i.job_name, i.position
),
routes AS (
    INSERT INTO event_routes (dag_name, job_name, dataset_uuid, dataset_version, event_key,
                              event_id, task_id, created_at)
    SELECT t.dag_name, t.job_name, t.dataset_uuid, t.dataset_version, t.event_key, t.event_id,
           gen_random_uuid(), n.now
    FROM targets AS t, n
    ORDER BY t.event_id, t.dag_name, t.job_name
    ON CONFLICT DO NOTHING
    RETURNING dag_name, job_name, event_id, task_id
),
marked AS (
    UPDATE task_events AS e
    SET routed_at = n.now, route_reason = ev.reason
    FROM ev, n
    WHERE e.event_id = ev.event_id
)
SELECT ev.event_id, ev.reason, ev.created_at AS event_created_at, r.dag_name, r.job_name,
       r.task_id, t.input
FROM ev
LEFT JOIN routes AS r ON r.event_id = ev.event_id
LEFT JOIN targets AS t
       ON t.event_id = r.event_id AND t.dag_name = r.dag_name AND t.job_name = r.job_name
ORDER BY ev.event_id, r.dag_name, r.job_name

-- name: start_routed_runs
-- One run per new route, with the route's task id (taskplat_start_job_run, migration 0023: the
-- task, its pins, its wake-up, held while its queue's workers wait on a dispatcher, and the
-- NOTIFY that wakes them or the relay). A route whose job was deleted meanwhile starts nothing
-- (NULL).
SELECT r.task_id,
       taskplat_start_job_run(r.dag_name, r.job_name, jsonb_build_array(r.input), NULL, NULL,
                              coalesce(%(now)s::timestamptz, now()), NULL, r.task_id,
                              %(hold_seconds)s) AS started
FROM unnest(%(dag_names)s::text[], %(job_names)s::text[], %(inputs)s::jsonb[],
            %(task_ids)s::uuid[]) AS r(dag_name, job_name, input, task_id)
