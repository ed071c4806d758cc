-- Failure semantics: infrastructure failures do not spend the retry budget, and one rule decides
-- what becomes of a task when an attempt ends, whoever ends it.
--
-- Invariants:
--   * an attempt ends `Completed`, `Canceled`, `Failed` (reported by its holder), `Drained` (its
--     holder stopped it while shutting down), `LeaseExpired` (its worker vanished) or
--     `DeadlineExceeded` (it ran past its hard deadline). `LeaseExpired` and `Drained` are not the
--     task's fault: they count in processing_attempts, not against max_attempts;
--   * attempts counted against max_attempts = attempt - replay_offset - processing_attempts; a
--     reported failure or a deadline overrun makes the task Dead (`AttemptsExhausted`) once that
--     reaches max_attempts. An infrastructure end makes it Dead (`ProcessingAttemptsExceeded`)
--     once processing_attempts reaches max_processing_attempts. A replay resets both budgets;
--   * taskplat_dead_reason / taskplat_ended_status / taskplat_retry_at are that rule: the
--     dispatcher's completions (single and batch) and the reaper's timeouts all call them, so the
--     rule is written once;
--   * a holder may fail a task for good (`retryable: false`): Dead at once, `PermanentFailure`;
--   * `on_exhausted` (`dead_letter` | `discard`) says whether a task that dies gets a dead-letter
--     record: a task of a job follows its job's setting (read when it dies, like its trust at
--     claim time), any other task its own (taskplat_dead_letter_wanted). A `resolved` record
--     follows only a dead letter that was sent;
--   * every column added here has a constant default: a catalog-only change, no table rewrite.

ALTER TABLE tasks ADD COLUMN processing_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN max_processing_attempts integer NOT NULL DEFAULT 10;
ALTER TABLE tasks ADD CONSTRAINT tasks_processing_attempts_check
    CHECK (processing_attempts >= 0 AND max_processing_attempts BETWEEN 1 AND 100);

ALTER TABLE tasks ADD COLUMN on_exhausted text NOT NULL DEFAULT 'dead_letter'
    CONSTRAINT tasks_on_exhausted_check CHECK (on_exhausted IN ('dead_letter', 'discard'));
ALTER TABLE jobs ADD COLUMN on_exhausted text NOT NULL DEFAULT 'dead_letter'
    CONSTRAINT jobs_on_exhausted_check CHECK (on_exhausted IN ('dead_letter', 'discard'));

ALTER TABLE tasks DROP CONSTRAINT tasks_attempt_outcome_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_attempt_outcome_check CHECK (attempt_outcome IN (
    'Completed', 'Failed', 'LeaseExpired', 'DeadlineExceeded', 'Canceled', 'Drained'));
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_outcome_check;
ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_outcome_check CHECK (outcome IN (
    'Completed', 'Failed', 'LeaseExpired', 'DeadlineExceeded', 'Canceled', 'Drained'));
ALTER TABLE tasks DROP CONSTRAINT tasks_dead_reason_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_dead_reason_check CHECK (dead_reason IN (
    'AttemptsExhausted', 'Expired', 'ProcessingAttemptsExceeded', 'PermanentFailure'));

-- Why the task dies of the attempt that ended `ended` (NULL: it lives on). `retryable` false is
-- a holder's permanent failure.
CREATE FUNCTION taskplat_dead_reason(t tasks, ended text, retryable boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN ended IN ('Completed', 'Canceled') THEN NULL
        WHEN ended IN ('LeaseExpired', 'Drained') THEN CASE
            WHEN t.processing_attempts + 1 >= t.max_processing_attempts
                THEN 'ProcessingAttemptsExceeded' END
        WHEN NOT retryable THEN 'PermanentFailure'
        WHEN t.attempt - t.replay_offset - t.processing_attempts >= t.max_attempts
            THEN 'AttemptsExhausted'
    END
$$;

-- The task's status after the attempt ended `ended`: Completed, Canceled, Failed (a retry
-- follows) or Dead.
CREATE FUNCTION taskplat_ended_status(t tasks, ended text, retryable boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN ended IN ('Completed', 'Canceled') THEN ended
        WHEN taskplat_dead_reason(t, ended, retryable) IS NULL THEN 'Failed'
        ELSE 'Dead'
    END
$$;

-- When the retry of a task that became Failed is due (NULL otherwise): `retry_after` seconds
-- from now when the holder asked for it, else the capped, fully jittered backoff of the budget
-- the end spent (processing attempts for an infrastructure end, counted attempts otherwise).
CREATE FUNCTION taskplat_retry_at(
    t tasks, ended text, retryable boolean, now timestamptz, retry_after double precision,
    jitter double precision
) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN taskplat_ended_status(t, ended, retryable) = 'Failed' THEN
        now + coalesce(make_interval(secs => retry_after), taskplat_retry_delay(
            t.backoff_base_seconds, t.backoff_max_seconds,
            CASE WHEN ended IN ('LeaseExpired', 'Drained') THEN t.processing_attempts + 1
                 ELSE t.attempt - t.replay_offset - t.processing_attempts END,
            jitter))
    END
$$;

-- Whether a task that died is dead-lettered: its job's `on_exhausted` for a task of a job still
-- applied, else its own.
CREATE FUNCTION taskplat_dead_letter_wanted(p_task_id uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(j.on_exhausted, t.on_exhausted) = 'dead_letter'
    FROM tasks AS t
    LEFT JOIN jobs AS j ON t.job IS NOT NULL
        AND j.dag_name = t.job ->> 'dag_name' AND j.name = t.job ->> 'name'
    WHERE t.task_id = p_task_id
$$;

DROP VIEW task_details;
CREATE VIEW task_details AS
SELECT
    t.*,
    t.attempt - t.replay_offset - t.processing_attempts AS counted_attempts,
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
