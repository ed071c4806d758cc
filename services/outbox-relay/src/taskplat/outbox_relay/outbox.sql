-- Outbox queries of the relay. Every statement names `sent_at IS NULL`: a row already marked sent
-- is never claimed, re-marked or pushed back. Time is coalesce(%(now)s::timestamptz, now()).

-- name: claim_pending
-- Lock up to %(limit)s due, unsent rows, oldest due first; rows another relay holds are skipped.
-- The locks last until the caller's transaction ends. The order (available_at, outbox_id) is the
-- pending partial index's, so the scan reads only pending rows however many sent rows the table
-- holds (ordering by outbox_id alone made the planner walk the primary key through every sent row).
-- `invoke_lambda` rows are the Lambda invoker's (lambda_invoker/invoke.sql), never part of a batch
-- of messages.
-- With %(skip_not_queued)s, an `enqueue_task` row whose task is not Queued in this statement's
-- snapshot (claimed already, canceled, finished, pruned) is marked sent here with `skipped`, and
-- returned with skipped = true so the caller sends nothing for it. Safe because every transition
-- into Queued writes its own `enqueue_task` row in the same transaction: a task that is Queued
-- when it is looked at is always sent, and one that becomes Queued later has a newer row.
-- Also with it, and %(hold_depth)s > 0: when the row's queue was claimed ahead within the last
-- %(hold_evidence_seconds)s (migration 0013) and at least %(hold_depth)s of its Queued tasks were
-- queued before the row's task (`fronts`: the queued_at of the queue's hold_depth-th oldest Queued
-- task, looked up once per queue of the batch: MATERIALIZED, else the planner may inline it into
-- the join and look it up again for every row), the row is held: it stays pending,
-- due again after twice its age (at least 1 s, at most %(hold_max_seconds)s), and is returned
-- with held = true so the caller sends nothing for it now. Likewise, whatever its depth, the
-- wake-up of a Queued task whose queue's workers wait on the dispatcher for its tasks
-- (`queues.polled_until` ahead, migration 0016): a worker with a free slot keeps a waiting
-- claim, which takes the oldest Queued task, so the wake-up would only be answered NotClaimed;
-- once no worker has waited for a wait's length, the stamp has passed and the row is sent.
-- And whatever the setting: a wake-up of a queue the relay holds because its SQS queue does not
-- exist (`queues.sqs_missing_since`, migration 0025), unless skipped, is deferred: pushed to the
-- queue's next probe (at least 1 s ahead), flagged `held` (the outbox age gauge counts it only
-- once due again), and returned with deferred = true. So each such row is read once per probe,
-- not once per batch, and nothing is sent to the missing queue.
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
fronts AS MATERIALIZED (
    SELECT q.name AS queue,
           (SELECT t.queued_at
            FROM tasks AS t
            WHERE t.status = 'Queued' AND t.queue = q.name
            -- tasks_queued_idx's order, so a plan may stop after hold_depth entries
            ORDER BY t.queue, t.queued_at
            OFFSET %(hold_depth)s - 1
            LIMIT 1) AS front_end
    FROM queues AS q, n
    WHERE %(hold_depth)s > 0
      AND q.claimed_ahead_at > n.now - make_interval(secs => %(hold_evidence_seconds)s)
      AND q.name IN (SELECT b.queue FROM batch AS b WHERE b.kind = 'enqueue_task')
),
claimed AS (
    -- A wake-up's task, looked up by primary key (`IS TRUE`: no partial index matches, so the
    -- lookup is never a read of the whole Queued index): its queued_at while it is Queued, else
    -- NULL (claimed, canceled, finished, pruned).
    SELECT b.outbox_id, b.queue, b.kind,
           CASE WHEN b.kind = 'enqueue_task' THEN
               (SELECT coalesce(t.queued_at, '-infinity')
                FROM tasks AS t
                WHERE t.task_id = b.task_id AND (t.status = 'Queued') IS TRUE)
           END AS queued_at
    FROM batch AS b
    WHERE %(skip_not_queued)s::boolean
),
missing AS MATERIALIZED (
    -- Held queues of the batch (by primary key), and until when their wake-ups wait.
    SELECT q.name AS queue, greatest(q.sqs_next_probe_at, n.now + interval '1 second') AS until
    FROM queues AS q, n
    WHERE q.sqs_missing_since IS NOT NULL
      AND q.name IN (SELECT b.queue FROM batch AS b WHERE b.kind = 'enqueue_task')
),
to_defer AS (
    SELECT b.outbox_id, m.until
    FROM batch AS b
    JOIN missing AS m ON m.queue = b.queue
    WHERE b.kind = 'enqueue_task'
      AND NOT EXISTS (SELECT 1 FROM claimed AS c
                      WHERE c.outbox_id = b.outbox_id AND c.queued_at IS NULL)
),
polled AS MATERIALIZED (
    -- Queues whose workers wait on the dispatcher for their tasks (migration 0016).
    SELECT q.name AS queue
    FROM queues AS q, n
    WHERE %(hold_depth)s > 0
      AND q.polled_until > n.now
      AND q.name IN (SELECT b.queue FROM batch AS b WHERE b.kind = 'enqueue_task')
),
to_hold AS (
    SELECT c.outbox_id
    FROM claimed AS c
    JOIN fronts AS f ON f.queue = c.queue
    WHERE c.queued_at > f.front_end
    UNION
    SELECT c.outbox_id
    FROM claimed AS c
    JOIN polled AS p ON p.queue = c.queue
    WHERE c.kind = 'enqueue_task' AND c.queued_at IS NOT NULL
),
skipped AS (
    UPDATE outbox AS o
    SET sent_at = n.now,
        skipped = true
    FROM n
    WHERE o.outbox_id = ANY (ARRAY(
              SELECT c.outbox_id FROM claimed AS c
              WHERE c.kind = 'enqueue_task' AND c.queued_at IS NULL))
      AND o.sent_at IS NULL
    RETURNING o.outbox_id
),
held AS (
    UPDATE outbox AS o
    SET held = true,
        available_at = n.now + make_interval(secs => least(
            %(hold_max_seconds)s,
            greatest(1.0, 2 * extract(epoch FROM n.now - o.created_at))::double precision))
    FROM n
    WHERE o.outbox_id = ANY (ARRAY(SELECT h.outbox_id FROM to_hold AS h
                                   EXCEPT SELECT d.outbox_id FROM to_defer AS d))
      AND o.sent_at IS NULL
    RETURNING o.outbox_id
),
deferred AS (
    UPDATE outbox AS o
    SET held = true,
        available_at = d.until
    FROM to_defer AS d
    WHERE o.outbox_id = d.outbox_id
      AND o.sent_at IS NULL
    RETURNING o.outbox_id
)
SELECT b.outbox_id, b.kind, b.task_id, b.queue, b.payload, b.trace_context, b.send_attempts,
       s.outbox_id IS NOT NULL AS skipped, h.outbox_id IS NOT NULL AS held,
       d.outbox_id IS NOT NULL AS deferred
FROM batch AS b
LEFT JOIN skipped AS s USING (outbox_id)
LEFT JOIN held AS h USING (outbox_id)
LEFT JOIN deferred AS d USING (outbox_id)
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

-- name: hold_missing_queues
-- SQS answered that the SQS queues of %(queues)s do not exist: hold each (migration 0025; a queue
-- not registered yet is registered held), its first probe %(probe_base_seconds)s ahead, and push
-- the rows whose send failed (%(ids)s, %(errors)s) to that probe, flagged `held`, with the send
-- counted and its error kept. A queue held already keeps its since and its probe time. Returns
-- the queues this statement began to hold (`newly`) and every queue with its probe time.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
before AS MATERIALIZED (
    SELECT q.name FROM queues AS q
    WHERE q.name = ANY (%(queues)s::text[]) AND q.sqs_missing_since IS NOT NULL
),
held AS (
    INSERT INTO queues AS q (name, created_at, updated_at, sqs_missing_since, sqs_next_probe_at,
                             sqs_probes)
    SELECT u.name, n.now, n.now, n.now,
           n.now + make_interval(secs => %(probe_base_seconds)s::double precision), 0
    FROM unnest(%(queues)s::text[]) AS u(name), n
    WHERE u.name ~ '^[A-Za-z0-9_-]{1,64}$'  -- a name the registry refuses is not held
    ON CONFLICT (name) DO UPDATE
    SET sqs_missing_since = coalesce(q.sqs_missing_since, excluded.sqs_missing_since),
        sqs_next_probe_at = coalesce(q.sqs_next_probe_at, excluded.sqs_next_probe_at),
        sqs_probes = CASE WHEN q.sqs_missing_since IS NULL THEN 0 ELSE q.sqs_probes END
    RETURNING q.name, q.sqs_next_probe_at
),
deferred AS (
    UPDATE outbox AS o
    SET send_attempts = o.send_attempts + 1,
        last_error = f.error,
        held = true,
        available_at = greatest(h.sqs_next_probe_at, n.now + interval '1 second')
    FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS f(outbox_id, error), held AS h, n
    WHERE o.outbox_id = f.outbox_id
      AND o.queue = h.name
      AND o.sent_at IS NULL
    RETURNING o.outbox_id
)
SELECT h.name AS queue, h.sqs_next_probe_at AS next_probe_at,
       NOT EXISTS (SELECT 1 FROM before AS b WHERE b.name = h.name) AS newly,
       (SELECT count(*) FROM deferred) AS deferred
FROM held AS h

-- name: due_probes
-- Held queues whose probe is due, taken for %(lease_seconds)s (another relay looks meanwhile
-- only if this one never reports: it crashed or lost its connection).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE queues AS q
SET sqs_next_probe_at = n.now + make_interval(secs => %(lease_seconds)s::double precision)
FROM n
WHERE q.sqs_missing_since IS NOT NULL
  AND q.sqs_next_probe_at <= n.now
RETURNING q.name AS queue, q.sqs_probes AS probes

-- name: still_missing
-- Probes that found the SQS queue still missing (or could not tell): the next one after twice
-- the last wait, %(probe_base_seconds)s at first, at most %(probe_max_seconds)s.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE queues AS q
SET sqs_probes = q.sqs_probes + 1,
    sqs_next_probe_at = n.now + make_interval(secs => least(
        %(probe_max_seconds)s::double precision,
        %(probe_base_seconds)s::double precision * power(2, least(q.sqs_probes + 1, 30))))
FROM n
WHERE q.name = ANY (%(queues)s::text[])
  AND q.sqs_missing_since IS NOT NULL
RETURNING q.name AS queue

-- name: found_again
-- Probes that found the SQS queue: the queue is held no more. Its deferred wake-ups are due at
-- the probe time that deferred them (now or earlier; rows deferred while the probe was out, at
-- most `lease_seconds` later), and the relay loops are woken.
WITH released AS (
    UPDATE queues AS q
    SET sqs_missing_since = NULL, sqs_next_probe_at = NULL, sqs_probes = 0
    WHERE q.name = ANY (%(queues)s::text[])
      AND q.sqs_missing_since IS NOT NULL
    RETURNING q.name
)
SELECT r.name AS queue
FROM released AS r
CROSS JOIN LATERAL (SELECT pg_notify('taskplat_outbox', r.name)) AS wake

