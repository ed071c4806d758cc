-- Lambda runtime: the wake-up of a task of a `runtime: lambda` job is an invocation, not an SQS
-- message (docs/contracts.md "Lambda invocation").
--
-- Invariants:
--   * every `enqueue_task` outbox row of a task whose job says `runtime: lambda` is stored as an
--     `invoke_lambda` row (trigger outbox_lambda_wakeup), whichever statement writes it (a new run,
--     a retry moved back to Queued by the scheduler, a replay, a queue resume, routing): no writer
--     of wake-ups needs to know about runtimes, and none can forget one. The runtime is read from
--     the job when the wake-up is written, like trust and outputs at claim time; a task of no job,
--     or of a job no longer applied, keeps `enqueue_task`.
--   * the relay performs an `invoke_lambda` row: it claims the task on the function's behalf and
--     invokes the function in one transaction that also marks the row sent (see
--     taskplat.outbox_relay.invoker); the relay's SQS batches never take these rows.

ALTER TABLE outbox DROP CONSTRAINT outbox_kind_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_kind_check
    CHECK (kind IN ('enqueue_task', 'dead_letter', 'route_event', 'invoke_lambda'));

-- The invoker's scan: due, unsent invocations only.
CREATE INDEX outbox_invoke_pending_idx ON outbox (available_at, outbox_id)
    WHERE sent_at IS NULL AND kind = 'invoke_lambda';

CREATE FUNCTION taskplat_lambda_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1
        FROM tasks AS t
        JOIN jobs AS j ON j.dag_name = t.job ->> 'dag_name' AND j.name = t.job ->> 'name'
        WHERE t.task_id = NEW.task_id AND t.job IS NOT NULL AND j.runtime = 'lambda'
    ) THEN
        NEW.kind := 'invoke_lambda';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_lambda_wakeup BEFORE INSERT ON outbox
    FOR EACH ROW WHEN (NEW.kind = 'enqueue_task') EXECUTE FUNCTION taskplat_lambda_wakeup();
