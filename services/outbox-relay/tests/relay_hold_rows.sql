-- Setup rows of the relay's hold tests (not product code): a queue's claim-ahead stamp, as the
-- dispatcher writes it on a full claim-next, and a claim as a wrapper claiming ahead makes.

-- name: stamp_claimed_ahead
INSERT INTO queues (name, claimed_ahead_at) VALUES (%(queue)s, %(at)s)
ON CONFLICT (name) DO UPDATE SET claimed_ahead_at = EXCLUDED.claimed_ahead_at

-- name: claim_tasks
UPDATE tasks
SET status = 'Running', lease_token = gen_random_uuid(),
    lease_expires_at = now() + interval '30 seconds', worker_id = 'w-test', started_at = now()
WHERE task_id = ANY(%(task_ids)s::uuid[]) AND status = 'Queued'

-- name: hold_marks
SELECT task_id, created_at, available_at, sent_at, skipped FROM outbox ORDER BY outbox_id

-- name: stamp_polled
-- A waiting claim-next of the queue, as the dispatcher stamps it (migration 0016).
INSERT INTO queues (name, polled_until) VALUES (%(queue)s, %(until)s)
ON CONFLICT (name) DO UPDATE SET polled_until = EXCLUDED.polled_until
