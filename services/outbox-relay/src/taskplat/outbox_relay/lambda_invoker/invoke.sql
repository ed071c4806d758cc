-- Lambda invocations of the relay (taskplat.outbox_relay.lambda_invoker.invoker). One `invoke_lambda` row is
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
-- The claim every service makes (taskplat_claim, migration 0020) on a function's behalf: the
-- attempt's deadline is the function's timeout (the task's `timeout_seconds`, else
-- %(default_timeout_seconds)s), its first lease that timeout plus %(grace_seconds)s, and the worker
-- `lambda:<function>`, the function being %(function_prefix)s || operator.
-- Without capability keys (%(capability_keys)s false) an untrusted task is not claimable; the
-- operators of %(untrusted_operators)s run untrusted unless their job says `trust`.
SELECT * FROM taskplat_claim(ARRAY[%(task_id)s::uuid], NULL, NULL,
                             %(default_timeout_seconds)s::integer, %(now)s::timestamptz,
                             %(lease_token)s::uuid, %(function_prefix)s::text,
                             %(grace_seconds)s::double precision,
                             %(capability_keys)s::boolean, %(untrusted_operators)s::text[])

-- name: queued_untrusted
-- Whether a task the claim did not take is Queued and runs untrusted (taskplat_untrusted,
-- migration 0024): a relay without capability keys left it for that.
SELECT taskplat_untrusted(t.job, t.operator, %(untrusted_operators)s::text[]) AS untrusted
FROM tasks AS t
WHERE t.task_id = %(task_id)s
  AND t.status = 'Queued'

-- name: queued_limited
-- Whether a task the claim did not take is Queued and held back by a limit of its queue
-- (taskplat_limit_refusal, migration 0028): its reason, and when to try again.
SELECT r.reason, r.retry_after_ms
FROM tasks AS t,
     taskplat_limit_refusal(t.queue, t.concurrency_key, %(now)s::timestamptz) AS r
WHERE t.task_id = %(task_id)s
  AND t.status = 'Queued'

-- name: hold_back
-- The invocation row of a task a limit holds back waits %(delay)s seconds (no attempt counted).
UPDATE outbox
SET available_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)
WHERE outbox_id = %(outbox_id)s AND sent_at IS NULL

-- name: mark_skipped
-- Nothing to invoke (the task is not claimable: claimed, finished, canceled, paused, gone): the
-- row leaves the outbox like a skipped wake-up. A later transition into Queued writes a new row.
UPDATE outbox AS o
SET sent_at = coalesce(%(now)s::timestamptz, now()),
    skipped = true
WHERE o.outbox_id = %(outbox_id)s
  AND o.sent_at IS NULL
RETURNING o.outbox_id
