-- The registry of task queues: the queues a task may name, and whether each is paused.
--
-- Invariants:
--   * a queue is registered by the dispatcher at start-up from its `queues` setting (and by the
--     deployment's queue template): `POST /tasks` naming a queue missing here answers 422;
--   * rows are never deleted by the platform; `paused` only changes through
--     `PUT /queues/{queue}/pause` and `/resume`;
--   * while a queue is paused no claim hands out its tasks (NotClaimed `Paused`), the scheduler does
--     not re-announce them, and they stay Queued; on resume they are re-announced at once.
--   * every queue a task already names is registered here, so existing work stays claimable.

CREATE TABLE queues (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queues (name)
SELECT DISTINCT queue FROM tasks WHERE queue ~ '^[A-Za-z0-9_-]{1,64}$'
ON CONFLICT (name) DO NOTHING;
