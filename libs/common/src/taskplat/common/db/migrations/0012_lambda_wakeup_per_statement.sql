-- Lambda wake-ups, decided once per statement instead of once per row.
--
-- 0010's row trigger ran a query for every `enqueue_task` row, Lambda jobs or not: measured on
-- 20,000 rows inserted by one statement, about 60-85 us/row against 22-32 without it, and about
-- +300 us per single-row INSERT. This statement trigger first asks whether any job runs on
-- Lambda at all (an index probe on jobs_lambda_idx); only then it rewrites, in one set-based
-- UPDATE, the statement's `enqueue_task` rows whose task's job says `runtime: lambda`. Measured
-- the same way with no Lambda job: 24-26 us/row and within noise per single-row INSERT.
--
-- Invariants (unchanged from 0010): every `enqueue_task` row of a task whose job says
-- `runtime: lambda` is stored as `invoke_lambda` before its transaction can commit, whichever
-- statement wrote it; the runtime is read when the wake-up is written. The trigger runs after
-- the whole statement, so it also sees tasks the same statement inserted (a CTE's rows).

DROP TRIGGER outbox_lambda_wakeup ON outbox;
DROP FUNCTION taskplat_lambda_wakeup();

CREATE INDEX jobs_lambda_idx ON jobs (dag_name, name) WHERE runtime = 'lambda';

CREATE FUNCTION taskplat_lambda_wakeups() RETURNS trigger
LANGUAGE plpgsql AS $$
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
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_lambda_wakeups AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION taskplat_lambda_wakeups();
