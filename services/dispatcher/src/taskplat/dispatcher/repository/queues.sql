-- The queue registry, bulk replay and the dashboard's figures.
--
-- Pause and resume are guarded single-row updates of `queues`. A resume re-announces the queue's
-- Queued tasks (their wake-ups were answered NotClaimed `Paused` and deleted meanwhile) in the same
-- transaction, at most %(limit)s of them; the scheduler's re-publication covers any beyond. A
-- bulk replay is one transaction: the rows it picks are locked (SKIP LOCKED) as Dead or Canceled,
-- their pins checked (taskplat_replay_pins), and the others replayed as a new attempt with a
-- fresh budget, with their enqueue_task outbox rows.

-- name: register_queues
INSERT INTO queues (name, created_at, updated_at)
SELECT q, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
FROM unnest(%(names)s::text[]) AS q
ON CONFLICT (name) DO NOTHING

-- name: known_queues
SELECT name FROM queues ORDER BY name

-- name: list_queues
-- Depth and the oldest Queued task of each queue come from tasks_queued_idx (queue, queued_at).
-- `sqs`: whether the relay holds the queue because its SQS queue does not exist (migration 0025).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT q.name, q.paused, q.paused_at, q.created_at,
       jsonb_build_object(
           'state', CASE WHEN q.sqs_missing_since IS NULL THEN 'ok' ELSE 'missing' END,
           'since', q.sqs_missing_since,
           'next_probe_at', q.sqs_next_probe_at,
           'probes', q.sqs_probes) AS sqs,
       (SELECT count(*) FROM tasks AS t WHERE t.status = 'Queued' AND t.queue = q.name) AS depth,
       (SELECT count(*) FROM tasks AS t WHERE t.status = 'Running' AND t.queue = q.name)
           AS running,
       o.oldest AS oldest_queued_at,
       CASE WHEN o.oldest IS NOT NULL
            THEN greatest(extract(epoch FROM n.now - o.oldest), 0)::double precision
       END AS oldest_queued_age_seconds,
       u.concurrency_limit, u.key_concurrency_limit, u.rate_per_second, u.rate_burst,
       u.running AS limits_running, u.keys_at_limit, u.tokens_left
FROM queues AS q
CROSS JOIN n
LEFT JOIN LATERAL (
    SELECT min(t.queued_at) AS oldest FROM tasks AS t
    WHERE t.status = 'Queued' AND t.queue = q.name
) AS o ON true
LEFT JOIN LATERAL taskplat_queue_limits_use(ARRAY[q.name], n.now) AS u ON true
ORDER BY q.name

-- name: set_queue_limits
-- Replaces the queue's limits (registering it if new) and recounts its Running tasks: the one
-- writer of limits is taskplat_set_queue_limits (migration 0027).
SELECT name FROM taskplat_set_queue_limits(
    %(name)s, %(concurrency_limit)s, %(key_concurrency_limit)s,
    %(rate_per_second)s, %(rate_burst)s, %(now)s::timestamptz)

-- name: pause_queue
UPDATE queues AS q
SET paused = true,
    paused_at = coalesce(q.paused_at, coalesce(%(now)s::timestamptz, now())),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM (SELECT name, paused FROM queues WHERE name = %(name)s FOR UPDATE) AS before
WHERE q.name = before.name
RETURNING q.name, before.paused AS was_paused

-- name: resume_queue
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
resumed AS (
    UPDATE queues AS q
    SET paused = false, paused_at = NULL, updated_at = n.now
    FROM n
    WHERE q.name = %(name)s AND q.paused
    RETURNING q.name
),
due AS (
    SELECT t.task_id
    FROM tasks AS t, resumed AS r
    WHERE t.status = 'Queued' AND t.queue = r.name
    ORDER BY t.queued_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
),
announced AS (
    UPDATE tasks AS t
    SET last_wakeup_at = n.now, updated_at = n.now
    FROM n
    WHERE t.task_id = ANY(ARRAY(SELECT task_id FROM due))
    RETURNING t.task_id, t.queue
),
ob AS (  -- taskplat_enqueue_wakeups (migration 0020)
    SELECT count(*) AS written
    FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT a.task_id FROM announced AS a), n.now)
)
SELECT (SELECT count(*) FROM resumed) AS resumed, (SELECT count(*) FROM announced) AS announced,
       (SELECT written FROM ob) AS announced_wakeups

-- name: mark_claimed_ahead
-- A claim-next of the queue came back full (migration 0013): the relay may hold back wake-ups.
UPDATE queues SET claimed_ahead_at = coalesce(%(now)s::timestamptz, now()) WHERE name = %(name)s

-- name: mark_polled
-- A claim-next of the queue waits for its next task (migration 0016): creates hold its wake-ups
-- back for the next %(seconds)s, and NOTIFY the waiting claims instead.
UPDATE queues
SET polled_until = greatest(polled_until, coalesce(%(now)s::timestamptz, now())
                                          + make_interval(secs => %(seconds)s))
WHERE name = %(name)s

-- name: limit_retry_after
-- When a claim of the queue's next task may succeed, in milliseconds, while a limit of the
-- queue holds its tasks back (taskplat_limit_refusal, migration 0028); no row otherwise.
SELECT r.reason, r.retry_after_ms
FROM taskplat_limit_refusal(%(queue)s, NULL, %(now)s::timestamptz) AS r
WHERE r.reason <> 'KeyConcurrencyLimited'

-- name: sqs_missing_queues
-- Queues the relay holds because their SQS queue does not exist (migration 0025; the partial
-- index queues_sqs_probe_idx holds exactly those): the dispatcher's gauge.
SELECT count(*) AS queues FROM queues WHERE sqs_missing_since IS NOT NULL

-- name: queue_exists
SELECT name, paused FROM queues WHERE name = %(name)s

-- name: pick_replayable
-- The Dead or Canceled tasks named by ids, or chosen by a filter (newest finished first), locked.
SELECT t.task_id
FROM tasks AS t
WHERE t.status IN ('Dead', 'Canceled')
  AND (%(ids)s::uuid[] IS NULL OR t.task_id = ANY(%(ids)s::uuid[]))
  AND (%(status)s::text IS NULL OR t.status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
  AND (%(operator)s::text IS NULL OR t.operator = %(operator)s::text)
  AND (%(dag)s::text IS NULL OR t.job ->> 'dag_name' = %(dag)s::text)
  AND (%(job)s::text IS NULL OR t.job ->> 'name' = %(job)s::text)
ORDER BY t.finished_at DESC NULLS LAST, t.task_id
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: replay_tasks
-- Replay the picked tasks (locked by pick_replayable in this transaction, pins checked), each with
-- its wake-up (taskplat_replay, migration 0021: the single replay calls it too).
SELECT *
FROM taskplat_replay(%(ids)s::uuid[], coalesce(%(now)s::timestamptz, now()),
                     %(trace_context)s::jsonb)

-- name: existing_tasks
SELECT task_id FROM tasks WHERE task_id = ANY(%(ids)s::uuid[])

-- name: notify_outbox
SELECT pg_notify('taskplat_outbox', q) FROM unnest(%(queues)s::text[]) AS q

-- name: state_counts
-- Unfinished tasks by queue and state (each branch on its status's partial index), and tasks that
-- finished in the last hour (tasks_finished_idx serves the range).
SELECT queue, status, count(*) AS tasks
FROM tasks
WHERE status IN ('Scheduled', 'Queued', 'Running', 'Failed')
GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*)
FROM tasks
WHERE status IN ('Completed', 'Dead', 'Canceled')
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
GROUP BY queue, status
ORDER BY 1, 2

-- name: throughput
-- Tasks that finished in each minute of the last hour (tasks_finished_at_idx serves the range).
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'Completed') AS completed,
       count(*) FILTER (WHERE status = 'Dead') AS dead
FROM tasks
WHERE finished_at > coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
GROUP BY 1
ORDER BY 1
