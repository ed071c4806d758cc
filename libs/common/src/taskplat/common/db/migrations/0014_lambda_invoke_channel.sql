-- Lambda wake-ups get a NOTIFY channel of their own: `taskplat_invoke`.
--
-- Until now the relay's Lambda invoker listened on `taskplat_outbox`, so every wake-up of every
-- queue woke it, and each time it looked for `invoke_lambda` rows that were almost never there
-- (measured in W2 of `make bench`, one task at a time: a fifth of the relay's CPU). The statement
-- trigger of 0012 is the only writer of `invoke_lambda` rows, so it now says when it wrote some.
--
-- Invariants (unchanged from 0012, plus the last one):
--   * every `enqueue_task` row of a task whose job says `runtime: lambda` is stored as
--     `invoke_lambda` before its transaction can commit, whichever statement wrote it;
--   * a statement that stored one or more `invoke_lambda` rows NOTIFYs `taskplat_invoke` once
--     (delivered at commit, like every NOTIFY). It is an accelerator only: the invoker also
--     looks on its interval, which is how rows backed off after a failed Invoke come due.

CREATE OR REPLACE FUNCTION taskplat_lambda_wakeups() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rewritten bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM jobs WHERE runtime = 'lambda') THEN
        UPDATE outbox AS o
        SET kind = 'invoke_lambda'
        FROM new_rows AS n
        JOIN tasks AS t ON t.task_id = n.task_id
        JOIN jobs AS j ON j.dag_name = t.job ->> 'dag_name' AND j.name = t.job ->> 'name'
        WHERE o.outbox_id = n.outbox_id
          AND n.kind = 'enqueue_task'
          AND j.runtime = 'lambda';
        GET DIAGNOSTICS rewritten = ROW_COUNT;
        IF rewritten > 0 THEN
            PERFORM pg_notify('taskplat_invoke', '');
        END IF;
    END IF;
    RETURN NULL;
END
$$;
