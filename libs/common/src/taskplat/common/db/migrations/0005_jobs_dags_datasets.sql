-- Jobs, DAGs and datasets: events route work downstream (docs/ARCHITECTURE.md "Jobs, DAGs and datasets").
--
-- Invariants:
--   * a dataset has exactly one current version (datasets.current_version, a row of
--     dataset_versions); a new version never deletes an old one. Datasets are never deleted.
--   * a DAG is stored whole (dags.document, its sha256 in document_hash); its jobs, input edges and
--     outputs are the rows derived from that document and are replaced together in one
--     transaction when a different document is applied. Jobs are keyed by (dag_name, name).
--   * every stored event gets a `route_event` outbox row in the transaction that stores it
--     (trigger task_events_route): whichever statement inserts an event (a worker's events call,
--     a completion, a late completion, the sink), routing cannot be forgotten.
--   * event_routes holds one row per (job, dataset, version, position): the key of "exactly one
--     downstream task per job and event position". A row is written in the same transaction as
--     the task it names, so a relay that dies before commit leaves neither.
--   * task_pins lists the dataset versions a job task reads (its inputs); a version rollover
--     cancels the live tasks pinned to an older version through it.
--   * an event's identity within its producer task and dataset version is its position: a
--     partition key, else a block range "{start}-{end}", else a cursor; an event with no position
--     is refused by the API.

CREATE TABLE datasets (
    dataset_uuid      uuid PRIMARY KEY,
    name              text NOT NULL UNIQUE,
    kind              text NOT NULL CHECK (kind IN ('external', 'postgres', 'buffered_postgres', 's3')),
    -- Storage location template; {dataset_uuid} and {dataset_version} are filled at claim time.
    location          text NOT NULL,
    current_version   uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE TABLE dataset_versions (
    dataset_uuid      uuid NOT NULL REFERENCES datasets (dataset_uuid),
    dataset_version   uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    superseded_at     timestamptz,
    PRIMARY KEY (dataset_uuid, dataset_version)
);

CREATE TABLE dags (
    dag_name          text PRIMARY KEY,
    document          jsonb NOT NULL,
    document_hash     text NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE TABLE jobs (
    dag_name              text NOT NULL REFERENCES dags (dag_name) ON DELETE CASCADE,
    name                  text NOT NULL,
    operator              text NOT NULL,
    runtime               text NOT NULL CHECK (runtime IN ('ecs', 'lambda')),
    queue                 text NOT NULL,
    config                jsonb NOT NULL,
    trust                 text NOT NULL CHECK (trust IN ('trusted', 'untrusted')),
    schedule              text,
    -- The next cron tick (UTC) at which the scheduler starts a run; NULL without a schedule.
    schedule_next_at      timestamptz,
    max_attempts          integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    backoff_base_seconds  double precision NOT NULL CHECK (backoff_base_seconds >= 0),
    backoff_max_seconds   double precision NOT NULL CHECK (backoff_max_seconds >= 0),
    timeout_seconds       integer CHECK (timeout_seconds > 0),
    PRIMARY KEY (dag_name, name),
    CHECK ((schedule IS NULL) = (schedule_next_at IS NULL))
);

CREATE INDEX jobs_schedule_due_idx ON jobs (schedule_next_at) WHERE schedule_next_at IS NOT NULL;

CREATE TABLE job_outputs (
    dag_name          text NOT NULL,
    job_name          text NOT NULL,
    output_index      integer NOT NULL CHECK (output_index >= 0),
    dataset_uuid      uuid NOT NULL REFERENCES datasets (dataset_uuid),
    PRIMARY KEY (dag_name, job_name, output_index),
    FOREIGN KEY (dag_name, job_name) REFERENCES jobs (dag_name, name) ON DELETE CASCADE
);

CREATE TABLE job_inputs (
    dag_name          text NOT NULL,
    job_name          text NOT NULL,
    position          integer NOT NULL CHECK (position >= 0),
    dataset_uuid      uuid NOT NULL REFERENCES datasets (dataset_uuid),
    -- The producing job's output when the edge names one ({job, output_index}); NULL for
    -- {dataset}.
    from_job          text,
    from_output_index integer,
    -- A read-time predicate for the consumer, stored and passed on in the task's inputs.
    where_clause      text,
    PRIMARY KEY (dag_name, job_name, position),
    FOREIGN KEY (dag_name, job_name) REFERENCES jobs (dag_name, name) ON DELETE CASCADE
);

-- Routing looks up the consumers of a dataset.
CREATE INDEX job_inputs_dataset_idx ON job_inputs (dataset_uuid);

-- Events: the position key distinguishes events that differ only in their range, and routing
-- records its outcome.
-- Dropping the column drops the unique constraint built on it.
ALTER TABLE task_events DROP COLUMN event_key;
ALTER TABLE task_events ADD COLUMN event_key text GENERATED ALWAYS AS (
    CASE
        WHEN partition_key IS NOT NULL THEN 'p:' || partition_key
        WHEN range_start IS NOT NULL THEN 'p:' || range_start::text || '-' || range_end::text
        ELSE 'c:' || "cursor"::text
    END) STORED;
ALTER TABLE task_events ADD CONSTRAINT task_events_position_key
    UNIQUE (task_id, dataset_uuid, dataset_version, event_key);
ALTER TABLE task_events ADD CONSTRAINT task_events_has_position
    CHECK (partition_key IS NOT NULL OR range_start IS NOT NULL OR "cursor" IS NOT NULL);
-- NULL while not yet routed; 'NotCurrentVersion' or 'UnknownDataset' once the relay decided not
-- to route it (routed_at is set either way).
ALTER TABLE task_events ADD COLUMN route_reason text
    CHECK (route_reason IN ('NotCurrentVersion', 'UnknownDataset'));
CREATE INDEX task_events_dataset_idx ON task_events (dataset_uuid, dataset_version, event_id);

CREATE TABLE event_routes (
    dag_name          text NOT NULL,
    job_name          text NOT NULL,
    dataset_uuid      uuid NOT NULL,
    dataset_version   uuid NOT NULL,
    event_key         text NOT NULL,
    event_id          bigint NOT NULL,
    task_id           uuid NOT NULL,
    created_at        timestamptz NOT NULL,
    PRIMARY KEY (dag_name, job_name, dataset_uuid, dataset_version, event_key)
);

CREATE INDEX event_routes_event_idx ON event_routes (event_id);

CREATE TABLE task_pins (
    dataset_uuid      uuid NOT NULL,
    dataset_version   uuid NOT NULL,
    task_id           uuid NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    PRIMARY KEY (dataset_uuid, dataset_version, task_id)
);

CREATE INDEX task_pins_task_idx ON task_pins (task_id);

-- Why a task was canceled: by a person (`PUT /tasks/{id}/cancel`) or by a version rollover.
ALTER TABLE tasks ADD COLUMN cancel_reason text
    CHECK (cancel_reason IN ('Requested', 'VersionSuperseded'));
-- Listing by job: GET /tasks?dag=&job=.
CREATE INDEX tasks_job_created_idx ON tasks ((job ->> 'dag_name'), (job ->> 'name'),
    created_at DESC, task_id DESC) WHERE job IS NOT NULL;

ALTER TABLE outbox DROP CONSTRAINT outbox_kind_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_kind_check
    CHECK (kind IN ('enqueue_task', 'dead_letter', 'route_event'));

-- Every stored event is routed: its outbox row commits with it.
CREATE FUNCTION taskplat_route_event_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (kind, task_id, queue, payload, created_at, available_at)
    VALUES ('route_event', NEW.task_id, '', jsonb_build_object('event_id', NEW.event_id),
            NEW.created_at, NEW.created_at);
    PERFORM pg_notify('taskplat_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER task_events_route AFTER INSERT ON task_events
    FOR EACH ROW EXECUTE FUNCTION taskplat_route_event_outbox();

-- The outputs of a job resolved to its datasets' current versions, as a claim hands them to the
-- worker: [{output_index, dataset_uuid, dataset_version, location}] ([] for a task of no job, a
-- job with no outputs, or a job no longer applied).
CREATE FUNCTION taskplat_job_outputs(job jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN job IS NULL THEN '[]'::jsonb ELSE coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'output_index', o.output_index,
                   'dataset_uuid', d.dataset_uuid,
                   'dataset_version', d.current_version,
                   'location', replace(replace(d.location,
                       '{dataset_uuid}', d.dataset_uuid::text),
                       '{dataset_version}', d.current_version::text))
               ORDER BY o.output_index)
        FROM job_outputs AS o
        JOIN datasets AS d ON d.dataset_uuid = o.dataset_uuid
        WHERE o.dag_name = job ->> 'dag_name' AND o.job_name = job ->> 'name'), '[]'::jsonb) END
$$;

-- Start one run of a job: a Queued task built from the job's row (config merged with
-- `extra_config`), its pins, and its wake-up in the outbox. Returns the new task's id
-- (`p_task_id` when given), or NULL
-- when `idempotency_key` names an existing task or the job does not exist. The caller owns the
-- transaction (and NOTIFYs the relay).
CREATE FUNCTION taskplat_start_job_run(
    p_dag_name text,
    p_job_name text,
    p_inputs jsonb,
    p_extra_config jsonb,
    p_idempotency_key text,
    p_now timestamptz,
    p_trace_context jsonb,
    p_task_id uuid DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid := coalesce(p_task_id, gen_random_uuid());
    j jobs%ROWTYPE;
BEGIN
    SELECT * INTO j FROM jobs WHERE dag_name = p_dag_name AND name = p_job_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO tasks (
        task_id, status, queue, operator, job, config, inputs, max_attempts,
        backoff_base_seconds, backoff_max_seconds, timeout_seconds, idempotency_key, queued_at,
        created_at, updated_at)
    VALUES (
        new_id, 'Queued', j.queue, j.operator,
        jsonb_build_object('dag_name', j.dag_name, 'name', j.name),
        j.config || coalesce(p_extra_config, '{}'::jsonb), coalesce(p_inputs, '[]'::jsonb),
        j.max_attempts, j.backoff_base_seconds, j.backoff_max_seconds, j.timeout_seconds,
        p_idempotency_key, p_now, p_now, p_now)
    ON CONFLICT (idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO task_pins (dataset_uuid, dataset_version, task_id)
    SELECT DISTINCT (i ->> 'dataset_uuid')::uuid, (i ->> 'dataset_version')::uuid, new_id
    FROM jsonb_array_elements(coalesce(p_inputs, '[]'::jsonb)) AS i
    WHERE i ? 'dataset_uuid' AND i ? 'dataset_version';
    INSERT INTO outbox (kind, task_id, queue, payload, trace_context, created_at, available_at)
    VALUES ('enqueue_task', new_id, j.queue, jsonb_build_object('task_id', new_id::text),
            p_trace_context, p_now, p_now);
    RETURN new_id;
END
$$;

DROP VIEW task_details;
CREATE VIEW task_details AS
SELECT
    t.*,
    coalesce((
        SELECT json_agg(json_build_object(
                   'attempt', a.attempt, 'worker_id', a.worker_id, 'started_at', a.started_at,
                   'finished_at', a.finished_at, 'outcome', a.outcome, 'error', a.error)
               ORDER BY a.attempt)
        FROM task_attempts AS a WHERE a.task_id = t.task_id), '[]'::json) AS attempts,
    coalesce((
        SELECT json_agg(json_build_object(
                   'output_index', o.output_index, 'attempt', o.attempt,
                   'dataset_uuid', o.dataset_uuid, 'dataset_version', o.dataset_version,
                   'location', o.location, 'cursor', o."cursor", 'row_count', o.row_count,
                   'committed_at', o.committed_at)
               ORDER BY o.output_index)
        FROM task_outputs AS o WHERE o.task_id = t.task_id), '[]'::json) AS outputs
FROM tasks AS t;
