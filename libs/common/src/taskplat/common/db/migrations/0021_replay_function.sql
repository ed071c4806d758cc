-- The replay, one home: the single replay (`POST /tasks/{id}/retry`) and the bulk replay
-- (`POST /tasks/retry`) were two copies of the same reset, and had drifted (the bulk one kept
-- `cancel_reason`). Both now call taskplat_replay.
--
-- Invariants:
--   * guard: only a Dead or Canceled task is replayed; any other named task is left as it is and
--     not returned (the caller tells why from a fresh read);
--   * a replay is a new attempt with a fresh budget, Queued at once: `attempt + 1`,
--     `replay_offset` the attempt it replays from, no processing attempts, and nothing of the
--     attempt it replays (lease, worker, times, outcome, reasons, result) left on the row;
--   * each replayed task gets its wake-up (taskplat_enqueue_wakeups, never held) in the same
--     statement; the caller notifies the relay;
--   * the pin check (taskplat_replay_pins, migration 0017) comes first, in the caller's
--     transaction: this function does not look at pins;
--   * time is coalesce(p_now, now()).

CREATE FUNCTION taskplat_replay(
    p_task_ids uuid[],
    p_now timestamptz,
    p_trace_context jsonb DEFAULT NULL
) RETURNS TABLE (task_id uuid, queue text, operator text, attempt integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now constant timestamptz := coalesce(p_now, now());
    v_ids uuid[];
BEGIN
    IF coalesce(cardinality(p_task_ids), 0) = 0 THEN
        RETURN;
    END IF;
    WITH replayed AS (
        UPDATE tasks AS t
        SET status = 'Queued',
            attempt = t.attempt + 1,
            replay_offset = t.attempt,
            processing_attempts = 0,
            lease_token = NULL,
            lease_expires_at = NULL,
            deadline_at = NULL,
            worker_id = NULL,
            started_at = NULL,
            finished_at = NULL,
            next_retry_at = NULL,
            expires_at = NULL,
            attempt_outcome = NULL,
            dead_reason = NULL,
            cancel_reason = NULL,
            result = NULL,
            queued_at = v_now,
            updated_at = v_now
        WHERE t.task_id = ANY(p_task_ids)
          AND t.status IN ('Dead', 'Canceled')
        RETURNING t.task_id
    )
    SELECT array_agg(r.task_id ORDER BY r.task_id) INTO v_ids FROM replayed AS r;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM taskplat_enqueue_wakeups(v_ids, v_now, p_trace_context);
    RETURN QUERY
    SELECT t.task_id, t.queue, t.operator, t.attempt
    FROM tasks AS t
    WHERE t.task_id = ANY(v_ids)
    ORDER BY t.task_id;
END;
$$;

COMMENT ON FUNCTION taskplat_replay(uuid[], timestamptz, jsonb) IS
    'Replay the named Dead or Canceled tasks as new attempts, each with its wake-up.';
