-- DAGs, jobs and datasets of the dispatcher.
--
-- A DAG is applied in one transaction that holds the DAG's advisory lock: its row, its jobs, edges
-- and outputs are replaced together, and the datasets it names are created when missing. A version
-- rollover locks the dataset row (routing takes it FOR SHARE), so no event is routed against a
-- version that is being replaced. Time is coalesce(%(now)s::timestamptz, now()).

-- name: lock_dag
SELECT pg_advisory_xact_lock(hashtextextended('taskplat_dag:' || %(dag_name)s, 0))

-- name: dag_hash
SELECT document_hash FROM dags WHERE dag_name = %(dag_name)s

-- name: upsert_dag
INSERT INTO dags (dag_name, document, document_hash, created_at, updated_at)
SELECT %(dag_name)s, %(document)s, %(document_hash)s, n.now, n.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS n
ON CONFLICT (dag_name) DO UPDATE
SET document = EXCLUDED.document,
    document_hash = EXCLUDED.document_hash,
    updated_at = EXCLUDED.updated_at

-- name: delete_jobs
DELETE FROM jobs WHERE dag_name = %(dag_name)s

-- name: create_dataset
-- A new dataset with its first version (taskplat_create_dataset, migration 0022); nothing when the
-- name exists (see find_dataset).
SELECT dataset_uuid FROM taskplat_create_dataset(%(name)s, %(kind)s, %(location)s,
                                                 %(now)s::timestamptz)

-- name: find_dataset
SELECT dataset_uuid, name, kind FROM datasets WHERE name = %(name)s

-- name: insert_job
INSERT INTO jobs (dag_name, name, operator, runtime, queue, config, trust, schedule,
                  schedule_next_at, max_attempts, backoff_base_seconds, backoff_max_seconds,
                  timeout_seconds, on_exhausted, priority, concurrency_key)
VALUES (%(dag_name)s, %(name)s, %(operator)s, %(runtime)s, %(queue)s, %(config)s, %(trust)s,
        %(schedule)s, %(schedule_next_at)s, %(max_attempts)s, %(backoff_base_seconds)s,
        %(backoff_max_seconds)s, %(timeout_seconds)s, %(on_exhausted)s,
        %(priority)s, %(concurrency_key)s)

-- name: insert_job_outputs
INSERT INTO job_outputs (dag_name, job_name, output_index, dataset_uuid)
SELECT %(dag_name)s, %(job_name)s, o.output_index, o.dataset_uuid
FROM unnest(%(output_indexes)s::integer[], %(dataset_uuids)s::uuid[])
     AS o(output_index, dataset_uuid)

-- name: insert_job_inputs
INSERT INTO job_inputs (dag_name, job_name, position, dataset_uuid, from_job, from_output_index,
                        where_clause)
SELECT %(dag_name)s, %(job_name)s, i.position, i.dataset_uuid, i.from_job, i.from_output_index,
       i.where_clause
FROM unnest(%(positions)s::integer[], %(dataset_uuids)s::uuid[], %(from_jobs)s::text[],
            %(from_output_indexes)s::integer[], %(where_clauses)s::text[])
     AS i(position, dataset_uuid, from_job, from_output_index, where_clause)

-- name: get_dag
SELECT dag_name, document_hash, created_at, updated_at FROM dags WHERE dag_name = %(dag_name)s

-- name: list_dags
SELECT d.dag_name, d.document_hash, d.created_at, d.updated_at,
       (SELECT count(*) FROM jobs AS j WHERE j.dag_name = d.dag_name) AS jobs
FROM dags AS d
ORDER BY d.dag_name

-- name: dag_jobs
SELECT * FROM jobs WHERE dag_name = %(dag_name)s ORDER BY name

-- name: dag_job_inputs
SELECT i.job_name, i.position, i.dataset_uuid, i.from_job, i.from_output_index, i.where_clause,
       d.name AS dataset
FROM job_inputs AS i
JOIN datasets AS d ON d.dataset_uuid = i.dataset_uuid
WHERE i.dag_name = %(dag_name)s
ORDER BY i.job_name, i.position

-- name: dag_job_outputs
SELECT o.job_name, o.output_index, o.dataset_uuid, d.name AS dataset, d.kind
FROM job_outputs AS o
JOIN datasets AS d ON d.dataset_uuid = o.dataset_uuid
WHERE o.dag_name = %(dag_name)s
ORDER BY o.job_name, o.output_index

-- name: delete_dag
DELETE FROM dags WHERE dag_name = %(dag_name)s RETURNING dag_name

-- name: job_exists
SELECT 1 AS found FROM jobs WHERE dag_name = %(dag_name)s AND name = %(job_name)s

-- name: start_job_run
-- A run of a job by hand (taskplat_start_job_run, migration 0023: its task is created as
-- POST /tasks creates one, wake-up held and NOTIFY sent alike).
SELECT taskplat_start_job_run(%(dag_name)s, %(job_name)s, %(inputs)s, %(config)s,
                              %(idempotency_key)s, coalesce(%(now)s::timestamptz, now()),
                              %(trace_context)s,
                              p_hold_seconds => %(polled_wakeup_delay_seconds)s) AS task_id

-- name: list_datasets
SELECT dataset_uuid, name, kind, location, current_version, created_at
FROM datasets
ORDER BY name

-- name: get_dataset
SELECT d.dataset_uuid, d.name, d.kind, d.location, d.current_version, d.created_at,
       (SELECT max(e."cursor") FROM task_events AS e
        WHERE e.dataset_uuid = d.dataset_uuid AND e.dataset_version = d.current_version)
           AS latest_cursor
FROM datasets AS d
WHERE d.dataset_uuid = %(dataset_uuid)s

-- name: dataset_versions
SELECT v.dataset_version, v.created_at, v.superseded_at, v.current_since, v.became_current,
       v.dataset_version = d.current_version AS current
FROM dataset_versions AS v
JOIN datasets AS d ON d.dataset_uuid = v.dataset_uuid
WHERE v.dataset_uuid = %(dataset_uuid)s
ORDER BY v.dataset_version = d.current_version DESC, v.created_at DESC,
         v.superseded_at DESC NULLS FIRST

-- name: lock_dataset
SELECT dataset_uuid, current_version FROM datasets WHERE dataset_uuid = %(dataset_uuid)s FOR UPDATE

-- name: make_version_current
-- A new current version (%(how)s = 'created') or an earlier one again ('rollback'); every live task
-- pinned to another version of the dataset is canceled (VersionSuperseded) in the same statement
-- and returned. A Running holder learns it on its next heartbeat. The caller holds lock_dataset.
SELECT task_id, attempt, queue, operator, worker_id
FROM taskplat_make_version_current(%(dataset_uuid)s, %(dataset_version)s, %(how)s,
                                   coalesce(%(now)s::timestamptz, now()))

-- name: version_of_dataset
SELECT dataset_version FROM dataset_versions
WHERE dataset_uuid = %(dataset_uuid)s AND dataset_version = %(dataset_version)s

-- name: lock_pinned_datasets
-- Share-lock the datasets a new task's inputs name (a version change locks the row for update),
-- so the current versions read here stay current until the task and its pins commit; and every
-- version of them the inputs name.
SELECT d.dataset_uuid, d.current_version,
       ARRAY(SELECT v.dataset_version FROM dataset_versions AS v
             WHERE v.dataset_uuid = d.dataset_uuid
               AND v.dataset_version = ANY (%(dataset_versions)s::uuid[])) AS named_versions
FROM datasets AS d
WHERE d.dataset_uuid = ANY (%(dataset_uuids)s::uuid[])
ORDER BY d.dataset_uuid
FOR SHARE

-- name: job_trust
SELECT operator, trust FROM jobs WHERE dag_name = %(dag_name)s AND name = %(job_name)s

-- name: job_scope
SELECT j.operator, j.trust,
       ARRAY(SELECT DISTINCT i.dataset_uuid FROM job_inputs AS i
             WHERE i.dag_name = j.dag_name AND i.job_name = j.name) AS input_datasets
FROM jobs AS j
WHERE j.dag_name = %(dag_name)s AND j.name = %(job_name)s

-- name: list_events
SELECT e.event_id, e.dataset_uuid, e.dataset_version, e."cursor", e.partition_key,
       e.range_start, e.range_end, e.task_id, e.attempt, e.routed_at, e.route_reason,
       e.created_at,
       coalesce(ARRAY(SELECT r.task_id FROM event_routes AS r
                      WHERE r.event_id = e.event_id ORDER BY r.dag_name, r.job_name),
                '{}'::uuid[]) AS tasks
FROM task_events AS e
WHERE e.dataset_uuid = %(dataset_uuid)s
  AND (%(dataset_version)s::uuid IS NULL OR e.dataset_version = %(dataset_version)s::uuid)
  AND (%(before_event_id)s::bigint IS NULL OR e.event_id < %(before_event_id)s::bigint)
ORDER BY e.event_id DESC
LIMIT %(limit)s

-- name: task_events
-- The events a task emitted (every attempt), newest first, with what routing made of them.
SELECT e.event_id, e.dataset_uuid, e.dataset_version, e."cursor", e.partition_key,
       e.range_start, e.range_end, e.task_id, e.attempt, e.routed_at, e.route_reason,
       e.created_at,
       coalesce(ARRAY(SELECT r.task_id FROM event_routes AS r
                      WHERE r.event_id = e.event_id ORDER BY r.dag_name, r.job_name),
                '{}'::uuid[]) AS tasks
FROM task_events AS e
WHERE e.task_id = %(task_id)s
  AND (%(before_event_id)s::bigint IS NULL OR e.event_id < %(before_event_id)s::bigint)
ORDER BY e.event_id DESC
LIMIT %(limit)s
