-- Taskplat initial schema.
--
-- Invariants:
--   * tasks is the source of truth. A task row is never deleted while it is not terminal, and a retry
--     never creates a new row: it increments tasks.attempt.
--   * (tasks.attempt, tasks.lease_token) fences every write by a worker: a transition names the status,
--     attempt and lease token it expects. The lease token of an ended attempt stays on the row so a late
--     reply of that same attempt can be recognised.
--   * attempts used in the current budget = attempt - replay_offset; a task becomes Dead on failure when
--     that reaches max_attempts. A replay (POST /tasks/{id}/retry) sets replay_offset = the last attempt.
--   * task_attempts holds one row per attempt that was claimed, keyed by (task_id, attempt).
--   * outbox rows are written in the same transaction as the state change they announce; a row is
--     pending while sent_at is null.

CREATE TABLE tasks (
    task_id               uuid PRIMARY KEY,
    status                text NOT NULL CHECK (status IN (
                              'Scheduled', 'Queued', 'Running', 'Completed', 'Failed', 'Dead',
                              'Canceled')),
    queue                 text NOT NULL,
    operator              text NOT NULL,
    -- Room for jobs and DAGs: the job reference ({dag_name, name}, docs/contracts.md); a jobs table and a
    -- job_id foreign key come with the DAG work.
    job                   jsonb,
    config                jsonb NOT NULL DEFAULT '{}'::jsonb,
    inputs                jsonb NOT NULL DEFAULT '[]'::jsonb,
    attempt               integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    replay_offset         integer NOT NULL DEFAULT 0 CHECK (replay_offset >= 0),
    max_attempts          integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    backoff_base_seconds  double precision NOT NULL CHECK (backoff_base_seconds >= 0),
    backoff_max_seconds   double precision NOT NULL CHECK (backoff_max_seconds >= 0),
    timeout_seconds       integer CHECK (timeout_seconds > 0),
    lease_token           uuid,
    lease_expires_at      timestamptz,
    deadline_at           timestamptz,
    worker_id             text,
    scheduled_for         timestamptz,
    next_retry_at         timestamptz,
    expires_at            timestamptz,
    -- When the task last became Queued: schedule lag and the scheduler's "wake-up lost" rule use it.
    queued_at             timestamptz,
    -- Outcome of the current attempt once it ended (NULL while running or never run). A late
    -- completion is accepted only after a timeout (LeaseExpired, DeadlineExceeded).
    attempt_outcome       text CHECK (attempt_outcome IN (
                              'Completed', 'Failed', 'LeaseExpired', 'DeadlineExceeded', 'Canceled')),
    dead_reason           text CHECK (dead_reason IN ('AttemptsExhausted', 'Expired')),
    result                jsonb,
    last_error            text,
    idempotency_key       text UNIQUE,
    created_at            timestamptz NOT NULL,
    started_at            timestamptz,
    finished_at           timestamptz,
    updated_at            timestamptz NOT NULL,
    CHECK (status <> 'Running' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK (status <> 'Failed' OR next_retry_at IS NOT NULL),
    CHECK (status <> 'Scheduled' OR scheduled_for IS NOT NULL)
);

-- One partial index per hot predicate.
CREATE INDEX tasks_queued_idx ON tasks (queue, queued_at) WHERE status = 'Queued';
CREATE INDEX tasks_scheduled_due_idx ON tasks (scheduled_for) WHERE status = 'Scheduled';
CREATE INDEX tasks_retry_due_idx ON tasks (next_retry_at) WHERE status = 'Failed';
CREATE INDEX tasks_running_lease_idx ON tasks (lease_expires_at) WHERE status = 'Running';
CREATE INDEX tasks_running_deadline_idx ON tasks (deadline_at)
    WHERE status = 'Running' AND deadline_at IS NOT NULL;
CREATE INDEX tasks_expiring_idx ON tasks (expires_at)
    WHERE status IN ('Queued', 'Scheduled') AND expires_at IS NOT NULL;
CREATE INDEX tasks_finished_idx ON tasks (finished_at)
    WHERE status IN ('Completed', 'Dead', 'Canceled');
-- Listing: newest first, keyset pagination on (created_at, task_id).
CREATE INDEX tasks_created_idx ON tasks (created_at DESC, task_id DESC);
CREATE INDEX tasks_status_created_idx ON tasks (status, created_at DESC, task_id DESC);

CREATE TABLE task_attempts (
    task_id            uuid NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    attempt            integer NOT NULL,
    worker_id          text NOT NULL,
    lease_token        uuid NOT NULL,
    started_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    outcome            text CHECK (outcome IN (
                           'Completed', 'Failed', 'LeaseExpired', 'DeadlineExceeded', 'Canceled')),
    error              text,
    -- Digest of the accepted completion request: a repeat with the same digest is acknowledged.
    completion_digest  text,
    PRIMARY KEY (task_id, attempt)
);

CREATE TABLE task_outputs (
    task_id          uuid NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    output_index     integer NOT NULL CHECK (output_index >= 0),
    attempt          integer NOT NULL,
    dataset_uuid     uuid NOT NULL,
    dataset_version  uuid NOT NULL,
    location         text,
    "cursor"         bigint,
    row_count        bigint,
    committed_at     timestamptz NOT NULL,
    PRIMARY KEY (task_id, output_index)
);

CREATE TABLE task_events (
    event_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          uuid NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    attempt          integer NOT NULL,
    dataset_uuid     uuid NOT NULL,
    dataset_version  uuid NOT NULL,
    "cursor"         bigint,
    partition_key    text,
    range_start      bigint,
    range_end        bigint,
    -- The identity of an event within its dataset version: its partition, else its cursor.
    event_key        text GENERATED ALWAYS AS (
                         coalesce(partition_key, "cursor"::text, '')) STORED,
    created_at       timestamptz NOT NULL,
    -- Room for routing events to dependent jobs (DAG work): set once routed.
    routed_at        timestamptz,
    UNIQUE (task_id, dataset_uuid, dataset_version, event_key)
);

CREATE TABLE outbox (
    outbox_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text NOT NULL CHECK (kind IN ('enqueue_task', 'dead_letter')),
    task_id        uuid NOT NULL,
    queue          text NOT NULL,
    payload        jsonb NOT NULL,
    -- W3C trace context of the transaction that wrote the row.
    trace_context  jsonb,
    created_at     timestamptz NOT NULL,
    available_at   timestamptz NOT NULL,
    send_attempts  integer NOT NULL DEFAULT 0,
    last_error     text,
    sent_at        timestamptz
);

CREATE INDEX outbox_pending_idx ON outbox (available_at, outbox_id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;

-- Exponential backoff with full jitter, capped. `attempt_in_budget` counts from 1; `jitter` is a
-- uniform random number in [0, 1) supplied by the caller so tests can fix it.
CREATE FUNCTION taskplat_retry_delay(
    base_seconds double precision,
    max_seconds double precision,
    attempt_in_budget integer,
    jitter double precision
) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT make_interval(secs => jitter * least(
        max_seconds,
        base_seconds * power(2::double precision, least(greatest(attempt_in_budget - 1, 0), 60))
    ))
$$;

-- A task with its attempt history and outputs, as the public API shows it.
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
