-- Outbox queries of the relay. Every statement names `sent_at IS NULL`: a row already marked sent
-- is never claimed, re-marked or pushed back. Time is coalesce(%(now)s::timestamptz, now()).

-- name: claim_pending
-- Lock up to %(limit)s due, unsent rows, oldest due first; rows another relay holds are skipped.
-- The locks last until the caller's transaction ends. The order (available_at, outbox_id) is the
-- pending partial index's, so the scan reads only pending rows however many sent rows the table
-- holds (ordering by outbox_id alone made the planner walk the primary key through every sent row).
-- `invoke_lambda` rows are the invoker's (invoke.sql), never part of a batch of messages.
-- With %(skip_not_queued)s, an `enqueue_task` row whose task is not Queued in this statement's
-- snapshot (claimed already, canceled, finished, pruned) is marked sent here with `skipped`, and
-- returned with skipped = true so the caller sends nothing for it. Safe because every transition
-- into Queued writes its own `enqueue_task` row in the same transaction: a task that is Queued
-- when it is looked at is always sent, and one that becomes Queued later has a newer row.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
batch AS (
    SELECT o.outbox_id, o.kind, o.task_id, o.queue, o.payload, o.trace_context,
           o.send_attempts, o.available_at
    FROM outbox AS o, n
    WHERE o.sent_at IS NULL
      AND o.available_at <= n.now
      AND o.kind <> 'invoke_lambda'
    ORDER BY o.available_at, o.outbox_id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (
    SELECT b.*,
           (b.kind = 'enqueue_task' AND t.status IS DISTINCT FROM 'Queued') AS skip
    FROM batch AS b
    LEFT JOIN tasks AS t ON t.task_id = b.task_id
    WHERE %(skip_not_queued)s::boolean
),
skipped AS (
    UPDATE outbox AS o
    SET sent_at = n.now,
        skipped = true
    FROM n
    WHERE o.outbox_id = ANY (ARRAY(SELECT c.outbox_id FROM claimed AS c WHERE c.skip))
      AND o.sent_at IS NULL
    RETURNING o.outbox_id
)
SELECT b.outbox_id, b.kind, b.task_id, b.queue, b.payload, b.trace_context, b.send_attempts,
       s.outbox_id IS NOT NULL AS skipped
FROM batch AS b
LEFT JOIN skipped AS s USING (outbox_id)
ORDER BY b.available_at, b.outbox_id

-- name: mark_sent
UPDATE outbox AS o
SET sent_at = coalesce(%(now)s::timestamptz, now()),
    send_attempts = o.send_attempts + 1
FROM unnest(%(ids)s::bigint[]) AS s(outbox_id)
WHERE o.outbox_id = s.outbox_id
  AND o.sent_at IS NULL
RETURNING o.outbox_id

-- name: mark_failed
-- Push failed rows back by their own delay so they never block the rows behind them.
UPDATE outbox AS o
SET send_attempts = o.send_attempts + 1,
    last_error = f.error,
    available_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => f.delay_seconds)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[], %(delays)s::double precision[])
     AS f(outbox_id, error, delay_seconds)
WHERE o.outbox_id = f.outbox_id
  AND o.sent_at IS NULL
RETURNING o.outbox_id
