-- The Postgres-derived gauges of the dispatcher's /metrics.
--
-- Scraped every few seconds by every dispatcher replica, so each statement must stay cheap however
-- many finished tasks the table holds: every branch names ONE status (or the outbox's pending
-- predicate) so it is served by that status's partial index, never by a scan of finished rows.
-- `test_metrics_cost.py` checks the plans on a table of 200k finished tasks. Ages are seconds at
-- coalesce(%(now)s::timestamptz, now()), never negative.

-- name: task_gauges
-- Non-terminal tasks by queue and status; for Queued also the age of the oldest (by queued_at).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT q.queue, 'Queued' AS status, q.tasks,
       greatest(extract(epoch FROM n.now - q.oldest), 0)::double precision AS oldest_age
FROM (SELECT queue, count(*) AS tasks, min(queued_at) AS oldest
      FROM tasks
      WHERE status = 'Queued'
      GROUP BY queue) AS q, n
UNION ALL
SELECT queue, 'Scheduled', count(*), NULL FROM tasks WHERE status = 'Scheduled' GROUP BY queue
UNION ALL
SELECT queue, 'Running', count(*), NULL FROM tasks WHERE status = 'Running' GROUP BY queue
UNION ALL
SELECT queue, 'Failed', count(*), NULL FROM tasks WHERE status = 'Failed' GROUP BY queue

-- name: outbox_gauges
-- Pending (unsent) outbox rows by kind and the age of the oldest: by created_at, except for a row
-- the relay held back (migration 0013), which is late only from when it came due again.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT o.kind, o.pending,
       coalesce(greatest(extract(epoch FROM n.now - o.oldest), 0), 0)::double precision
           AS oldest_age
FROM (SELECT kind, count(*) AS pending,
             min(CASE WHEN NOT held THEN created_at
                      WHEN available_at <= n.now THEN available_at END) AS oldest
      FROM outbox, n
      WHERE sent_at IS NULL
      GROUP BY kind) AS o, n

-- name: dead_last_hour
-- Tasks that became Dead in the last hour, by queue and dead_reason (tasks_finished_idx serves the
-- finished_at range; only the last hour of finished rows is read).
SELECT queue, coalesce(dead_reason, 'Unknown') AS reason, count(*) AS tasks
FROM tasks
WHERE status = 'Dead'
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
GROUP BY queue, dead_reason
