-- Outbox queries of the relay. Every statement names `sent_at IS NULL`: a row already marked sent
-- is never claimed, re-marked or pushed back. Time is coalesce(%(now)s::timestamptz, now()).

-- name: claim_pending
-- Lock up to %(limit)s due, unsent rows, oldest first; rows another relay holds are skipped.
-- The locks last until the caller's transaction ends.
WITH batch AS (
    SELECT o.outbox_id
    FROM outbox AS o
    WHERE o.sent_at IS NULL
      AND o.available_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY o.outbox_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
SELECT o.outbox_id, o.kind, o.task_id, o.queue, o.payload, o.trace_context, o.send_attempts
FROM outbox AS o
JOIN batch USING (outbox_id)
ORDER BY o.outbox_id

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
