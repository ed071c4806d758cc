-- A task queue whose SQS queue does not exist is held by the relay as one, instead of each of its
-- wake-ups failing and backing off on its own (docs/operations.md, "A held queue").
--
-- Invariants:
--   * `sqs_missing_since` is set (NULL: not held) when SendMessageBatch to the queue's SQS queue
--     answered that it does not exist; `sqs_next_probe_at` is when a relay looks again
--     (GetQueueUrl), `sqs_probes` how many looks found it still missing (the backoff doubles with
--     each, up to the relay's `missing_queue_probe_max_seconds`). All three are written by the
--     relay only: set together, cleared together when a probe finds the SQS queue.
--   * While a queue is held the relay sends none of its wake-ups: its claim of outbox rows pushes
--     each one it meets to the next probe (flagged `held`, so the outbox age gauge counts it only
--     from when it comes due again), and the scheduler does not re-announce its Queued tasks.
--     Its tasks stay Queued and claimable by claim-next and waiting claims; no wake-up is lost:
--     every one is still a pending row, sent once the queue resumes.

ALTER TABLE queues
    ADD COLUMN sqs_missing_since timestamptz,
    ADD COLUMN sqs_next_probe_at timestamptz,
    ADD COLUMN sqs_probes integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT queues_sqs_missing_check
        CHECK ((sqs_missing_since IS NULL) = (sqs_next_probe_at IS NULL));

-- The relay's look for due probes reads only held queues.
CREATE INDEX queues_sqs_probe_idx ON queues (sqs_next_probe_at)
    WHERE sqs_missing_since IS NOT NULL;
