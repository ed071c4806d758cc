-- Setup rows of the relay's hold tests (not product code): a queue's claim-ahead stamp, as the
-- dispatcher writes it on a full claim-next, and the claim (taskplat_claim).

-- name: stamp_claimed_ahead
INSERT INTO queues (name, claimed_ahead_at) VALUES (%(queue)s, %(at)s)
ON CONFLICT (name) DO UPDATE SET claimed_ahead_at = EXCLUDED.claimed_ahead_at

-- name: claim_tasks
-- The claim every service makes (taskplat_claim, migration 0020): e.g. a wrapper claiming ahead.
SELECT task_id FROM taskplat_claim(%(task_ids)s::uuid[], 'w-test', 30, 3600)

-- name: hold_marks
SELECT task_id, created_at, available_at, sent_at, skipped FROM outbox ORDER BY outbox_id

-- name: stamp_polled
-- A waiting claim-next of the queue, as the dispatcher stamps it (migration 0016).
INSERT INTO queues (name, polled_until) VALUES (%(queue)s, %(until)s)
ON CONFLICT (name) DO UPDATE SET polled_until = EXCLUDED.polled_until
