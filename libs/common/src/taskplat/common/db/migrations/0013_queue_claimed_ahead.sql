-- When a queue's workers last claimed ahead, and which outbox rows the relay held back because of
-- it: the relay holds back the wake-ups of a backlog those workers drain without them.
--
-- Invariants:
--   * `claimed_ahead_at` is when a `task-claim-next` for the queue last came back full (as many
--     tasks as asked, two or more): its workers are draining a backlog, oldest task first,
--     straight from the dispatcher. Each dispatcher writes it at most once a second per queue;
--     NULL: never.
--   * It is a hint, never a guarantee: the relay reads it to decide whether to send a wake-up now
--     or look at it again later (outbox.sql `claim_pending`), and every wake-up it holds back is
--     still a pending outbox row that comes due again, so no Queued task loses its wake-up.

--   * `outbox.held` is true once the relay held the row back (its `available_at` then is when it
--     looks at it again). A held row is still pending; the outbox age gauge counts it only from
--     when it came due again, since being held is not being late (the relay scales on that age).

ALTER TABLE queues ADD COLUMN claimed_ahead_at timestamptz;
ALTER TABLE outbox ADD COLUMN held boolean NOT NULL DEFAULT false;
