-- Until when a queue's workers wait on the dispatcher for its next task (`task-claim-next` with
-- `wait_seconds`): a new task of such a queue is claimed by a waiting worker at once, woken by
-- a NOTIFY on `taskplat_queued`, and its SQS wake-up goes out a little later, only if that task
-- is still Queued by then. And the trace context of a task's create, which a claim made without
-- a wake-up (that carries it otherwise) hands to the worker.
--
-- Invariants:
--   * `polled_until` is how long the latest waiting claim-next of the queue may wait, written by
--     the dispatcher that holds it (at most every half wait per queue and dispatcher, and only
--     while that dispatcher is listening on `taskplat_queued`); NULL: never polled.
--   * It is a hint, never a guarantee: while it lies ahead, a create writes its task's wake-up
--     due `polled_wakeup_delay_seconds` later and NOTIFYs `taskplat_queued` instead of
--     `taskplat_outbox`. That wake-up is still a pending outbox row: if no waiting worker
--     claimed the task by then (the worker died, every slot was busy, the NOTIFY was lost), the
--     relay sends it; if one did, the relay skips it (`skip_not_queued`). Delayed, never lost.

ALTER TABLE queues ADD COLUMN polled_until timestamptz;
--   * `tasks.trace_context` is the W3C trace context of the create that wrote the task (the same
--     as its first wake-up's), NULL without tracing or for a task made by routing or a job run;
--     every claim answers it, so an attempt claimed without its wake-up continues that trace.

ALTER TABLE tasks ADD COLUMN trace_context jsonb;
