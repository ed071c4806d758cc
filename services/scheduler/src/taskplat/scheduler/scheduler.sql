-- Batches of the scheduler loop.
--
-- Each query is one statement that selects a bounded batch with FOR UPDATE SKIP LOCKED, moves the
-- rows with an UPDATE guarded by the status and attempt it selected, and writes one `enqueue_task`
-- outbox row per moved task (taskplat_enqueue_wakeups, migration 0020, like every wake-up). Selection,
-- transition and outbox row therefore commit together or not at all, and two replicas never move the
-- same row: a locked row is skipped, and a row another replica moved after this statement's snapshot
-- fails the re-checked predicate. Time is coalesce(%(now)s::timestamptz, now()). Each returns the
-- moved tasks' task_id, attempt (after the move), queue and operator, for logs and metrics.

-- name: queue_due
-- Scheduled -> Queued once scheduled_for has come, and Failed -> Queued at next_retry_at, each kind
-- in its own bounded batch (%(promote_limit)s, %(retry_limit)s), with their wake-ups: the
-- function taskplat_queue_due (migration 0020) states the rule. Returns `moved_from` (Scheduled
-- or Failed) per task.
SELECT * FROM taskplat_queue_due(%(now)s::timestamptz, %(promote_limit)s::integer,
                                 %(retry_limit)s::integer)

-- name: republish_unclaimed
-- A Queued task unclaimed for requeue_after_seconds probably lost its wake-up: write a fresh one and
-- set last_wakeup_at to now, so the task is re-announced at most once per period (queued_at keeps
-- the time it became Queued, for schedule lag). Tasks already past expires_at are left for the
-- reaper.
-- A queue with a Running task is busy: its workers are taking its wake-ups, so under a backlog its
-- stale tasks are mostly still waiting their turn in SQS and a fresh wake-up would only queue
-- behind the old one. A busy queue gets at most %(busy_limit)s re-publications (its oldest stale
-- tasks) per statement, and none while it is in %(closed)s (the caller's list of busy queues whose
-- budget for the period is spent). An idle queue's stale tasks are all re-announced, as before, so
-- a lost wake-up waits at most until its queue is idle or its turn in the busy budget comes.
-- %(busy)s names queues the caller also counts as busy (seen with a Running task within the
-- period: short tasks leave a busy queue without a Running one at many instants).
-- Each returned row says whether its queue was busy.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
busy AS MATERIALIZED (
    SELECT r.queue FROM tasks AS r WHERE r.status = 'Running'
    UNION
    SELECT unnest(%(busy)s::text[])
),
due AS (
    SELECT t.task_id, t.queue, greatest(t.queued_at, t.last_wakeup_at) AS woken
    FROM tasks AS t, n
    WHERE t.status = 'Queued'
      -- A paused queue's tasks wait: they are re-announced when it resumes, not meanwhile.
      -- So do those of a queue the relay holds because its SQS queue does not exist (migration
      -- 0025): their pending wake-ups go out once it resumes, and a fresh one would only be
      -- deferred with them.
      AND NOT EXISTS (SELECT 1 FROM queues AS q
                      WHERE q.name = t.queue
                        AND (q.paused OR q.sqs_missing_since IS NOT NULL))
      AND NOT (t.queue = ANY(%(closed)s::text[])
               AND EXISTS (SELECT 1 FROM busy AS b WHERE b.queue = t.queue))
      AND (greatest(t.queued_at, t.last_wakeup_at) IS NULL
           OR greatest(t.queued_at, t.last_wakeup_at)
              <= n.now - make_interval(secs => %(requeue_after_seconds)s::double precision))
      AND (t.expires_at IS NULL OR t.expires_at > n.now)
    ORDER BY greatest(t.queued_at, t.last_wakeup_at) NULLS FIRST
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
),
ranked AS (
    SELECT d.task_id,
           EXISTS (SELECT 1 FROM busy AS b WHERE b.queue = d.queue) AS busy,
           row_number() OVER (PARTITION BY d.queue ORDER BY d.woken NULLS FIRST) AS rank
    FROM due AS d
),
picked AS (
    SELECT task_id, busy FROM ranked WHERE NOT busy OR rank <= %(busy_limit)s
),
moved AS (
    UPDATE tasks AS t
    SET last_wakeup_at = n.now,
        updated_at = n.now
    FROM n
    -- Locked as Queued by `due` (FOR UPDATE re-tests its WHERE), so no status test here: it
    -- would let the planner read the whole Queued index instead of the primary key.
    WHERE t.task_id = ANY(ARRAY(SELECT task_id FROM picked))
    RETURNING t.task_id, t.attempt, t.queue, t.operator
),
ob AS (  -- taskplat_enqueue_wakeups (migration 0020)
    SELECT count(*) AS written
    FROM n, taskplat_enqueue_wakeups(ARRAY(SELECT m.task_id FROM moved AS m), n.now)
)
SELECT m.task_id, m.attempt, m.queue, m.operator, p.busy
FROM moved AS m
JOIN picked AS p USING (task_id)
CROSS JOIN ob  -- one row, read so that it runs

-- name: busy_queues
-- Queues with a Running task (the partial Running index: bounded by the workers' slots).
SELECT DISTINCT queue FROM tasks WHERE status = 'Running'

-- name: notify_outbox
-- Wake the outbox relay; delivered on commit, so only if the outbox rows were committed.
SELECT pg_notify('taskplat_outbox', q) FROM unnest(%(queues)s::text[]) AS q
