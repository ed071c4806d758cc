-- Lambda invocations of the relay (taskplat.outbox_relay.invoker). One `invoke_lambda` row is
-- taken, its task claimed for the function and the row marked, all in the caller's transaction,
-- which stays open around the Invoke call. Time is coalesce(%(now)s::timestamptz, now()).

-- name: claim_invocation
-- Lock one due, unsent invocation, oldest due first; rows another relay holds are skipped.
SELECT o.outbox_id, o.kind, o.task_id, o.queue, o.payload, o.trace_context, o.send_attempts
FROM outbox AS o
WHERE o.sent_at IS NULL
  AND o.kind = 'invoke_lambda'
  AND o.available_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY o.available_at, o.outbox_id
LIMIT 1
FOR UPDATE OF o SKIP LOCKED

-- name: claim_for_function
-- The dispatcher's claim (its `claim_task`) made on a function's behalf: the same guards (Queued,
-- not expired, queue not paused; tests/schema/test_claim_guards.py holds the two statements to
-- the same answers), the same attempt record, the same returned row. Only the times differ: the
-- attempt's deadline is the function's timeout (the task's `timeout_seconds`, else
-- %(default_timeout_seconds)s) and its first lease that timeout plus %(grace_seconds)s; the worker
-- is `lambda:<function>`, the function being %(function_prefix)s || operator.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
claimed AS (
    UPDATE tasks AS t
    SET status = 'Running',
        lease_token = %(lease_token)s,
        lease_expires_at = n.now + make_interval(
            secs => coalesce(t.timeout_seconds, %(default_timeout_seconds)s) + %(grace_seconds)s),
        deadline_at = n.now + make_interval(secs => coalesce(t.timeout_seconds,
                                                             %(default_timeout_seconds)s)),
        worker_id = 'lambda:' || %(function_prefix)s || t.operator,
        started_at = n.now,
        attempt_outcome = NULL,
        next_retry_at = NULL,
        updated_at = n.now
    FROM n
    WHERE t.task_id = %(task_id)s
      AND t.status = 'Queued'
      AND (t.expires_at IS NULL OR t.expires_at > n.now)
      AND NOT EXISTS (SELECT 1 FROM queues AS q WHERE q.name = t.queue AND q.paused)
    RETURNING t.task_id, t.attempt, t.job, t.operator, t.queue, t.config, t.inputs,
              t.timeout_seconds, t.deadline_at, t.lease_token, t.lease_expires_at,
              t.worker_id, t.started_at, t.queued_at, t.created_at, t.replay_offset,
              taskplat_job_outputs(t.job) AS outputs, taskplat_job_trust(t.job) AS trust,
              taskplat_task_steps(t.task_id, t.attempt) AS steps, t.trace_context
),
history AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, lease_token, started_at)
    SELECT task_id, attempt, worker_id, lease_token, started_at FROM claimed
)
SELECT * FROM claimed

-- name: mark_skipped
-- Nothing to invoke (the task is not claimable: claimed, finished, canceled, paused, gone): the
-- row leaves the outbox like a skipped wake-up. A later transition into Queued writes a new row.
UPDATE outbox AS o
SET sent_at = coalesce(%(now)s::timestamptz, now()),
    skipped = true
WHERE o.outbox_id = %(outbox_id)s
  AND o.sent_at IS NULL
RETURNING o.outbox_id
