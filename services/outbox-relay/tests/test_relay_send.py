"""run_once against real Postgres and real SQS: what is sent, where, and how rows are marked."""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import uuid4

import pytest
from relay_harness import Queues, Rows, task_ids_of

from taskplat.common.clock import FakeClock
from taskplat.common.contracts.messages import DeadLetterRecord
from taskplat.common.sqs import wake_up_body
from taskplat.outbox_relay.relay import Relay, RelayBatch
from taskplat.outbox_relay.settings import RelaySettings


def test_sends_one_wakeup_per_row_with_the_exact_body_and_marks_rows_sent(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock
) -> None:
    url = queues.create("default")
    task_ids = rows.queued_tasks("default", 3)

    assert relay.run_once() == RelayBatch(
        claimed=3, sent=3, dead_letters_sent=0, failed=0, more=False
    )

    messages = queues.receive(url, 3)
    assert sorted(message["Body"] for message in messages) == sorted(
        wake_up_body(task_id) for task_id in task_ids
    )
    assert all("MessageAttributes" not in message for message in messages)
    for row in rows.outbox():
        assert row["sent_at"] == clock.now()
        assert row["send_attempts"] == 1
        assert row["last_error"] is None
    assert relay.run_once() == RelayBatch(0, 0, 0, 0, more=False)


@pytest.mark.parametrize("relay_overrides", [{"batch_size": 30}])
def test_many_rows_go_out_in_several_calls_and_batches(
    relay: Relay, rows: Rows, queues: Queues, settings: RelaySettings
) -> None:
    urls = {queue: queues.create(queue) for queue in ("alpha", "beta")}
    expected = {"alpha": rows.queued_tasks("alpha", 23), "beta": rows.queued_tasks("beta", 12)}

    first = relay.run_once()
    assert (first.claimed, first.sent, first.more) == (settings.batch_size, 30, True)
    second = relay.run_once()
    assert (second.claimed, second.sent, second.failed, second.more) == (5, 5, 0, False)

    for queue, url in urls.items():
        messages = queues.receive(url, len(expected[queue]))
        assert sorted(task_ids_of(messages)) == sorted(expected[queue])
    assert all(row["sent_at"] is not None for row in rows.outbox())


def test_rows_of_a_missing_queue_are_retried_later_without_blocking_others(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, settings: RelaySettings
) -> None:
    url = queues.create("present")
    missing = rows.queued_tasks("ghost", 2)
    present = rows.queued_tasks("present", 2)

    assert relay.run_once() == RelayBatch(
        claimed=4, sent=2, dead_letters_sent=0, failed=2, more=False
    )
    assert sorted(task_ids_of(queues.receive(url, 2))) == sorted(present)
    by_task = rows.by_task()
    for task_id in missing:
        row = by_task[task_id]
        assert row["sent_at"] is None
        assert row["send_attempts"] == 1
        assert row["last_error"] == f"SQS queue {queues.name('ghost')} does not exist"
        # Held with its queue (test_relay_missing_queue): due at the queue's first probe.
        assert row["available_at"] == clock.now() + timedelta(
            seconds=settings.missing_queue_probe_base_seconds
        )
    # Not due yet: nothing is claimed, whatever the queue.
    assert relay.run_once().claimed == 0

    ghost_url = queues.create("ghost")
    clock.advance(settings.missing_queue_probe_base_seconds)
    assert relay.run_once() == RelayBatch(
        claimed=2, sent=2, dead_letters_sent=0, failed=0, more=False
    )
    assert sorted(task_ids_of(queues.receive(ghost_url, 2))) == sorted(missing)
    by_task = rows.by_task()
    assert all(by_task[task_id]["send_attempts"] == 2 for task_id in missing)
    assert all(by_task[task_id]["sent_at"] == clock.now() for task_id in missing)


def test_a_queue_deleted_after_its_url_was_cached_is_found_again_once_recreated(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, settings: RelaySettings
) -> None:
    queues.create("flaky")
    rows.queued_tasks("flaky", 1)
    assert relay.run_once().sent == 1
    queues.delete("flaky")

    [task_id] = rows.queued_tasks("flaky", 1)
    assert relay.run_once().failed == 1
    assert (
        rows.by_task()[task_id]["last_error"] == f"SQS queue {queues.name('flaky')} does not exist"
    )

    url = queues.create("flaky")
    clock.advance(settings.missing_queue_probe_base_seconds)
    assert relay.run_once().sent == 1
    assert task_ids_of(queues.receive(url, 1)) == [task_id]


def test_dead_letter_rows_go_to_the_dead_letter_queue_as_records(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock
) -> None:
    dlq_url = queues.create_dead_letters()
    task_id = rows.dead_task("default", last_error="operator exited with 3")

    assert relay.run_once() == RelayBatch(
        claimed=1, sent=0, dead_letters_sent=1, failed=0, more=False
    )

    [message] = queues.receive(dlq_url, 1)
    record = DeadLetterRecord.model_validate_json(message["Body"])
    assert record == DeadLetterRecord(
        task_id=task_id,
        queue="default",
        operator="echo",
        attempt=3,
        max_attempts=3,
        dead_reason="AttemptsExhausted",
        last_error="operator exited with 3",
        died_at=clock.now(),
    )
    assert rows.by_task()[task_id]["sent_at"] == clock.now()


def test_a_malformed_dead_letter_payload_is_kept_with_its_error_and_blocks_nothing(
    relay: Relay, rows: Rows, queues: Queues
) -> None:
    dlq_url = queues.create_dead_letters()
    good = rows.dead_task("default")
    bad = uuid4()
    rows.raw_outbox("dead_letter", bad, "default", {"task_id": str(bad), "queue": "default"})

    result = relay.run_once()
    assert (result.dead_letters_sent, result.failed) == (1, 1)
    assert [json.loads(m["Body"])["task_id"] for m in queues.receive(dlq_url, 1)] == [str(good)]
    malformed = rows.by_task()[bad]
    assert malformed["sent_at"] is None
    assert malformed["send_attempts"] == 1
    assert malformed["last_error"].startswith(
        "invalid dead-letter payload: operator: Field required"
    )


def test_the_trace_context_travels_as_message_attributes(
    relay: Relay, rows: Rows, queues: Queues
) -> None:
    url = queues.create("traced")
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    [traced] = rows.queued_tasks(
        "traced", trace_context={"traceparent": traceparent, "tracestate": "vendor=1"}
    )
    [partial] = rows.queued_tasks("traced", trace_context={"traceparent": traceparent})

    assert relay.run_once().sent == 2

    by_task = {task_ids_of([m])[0]: m for m in queues.receive(url, 2)}
    assert by_task[traced]["Body"] == wake_up_body(traced)
    assert by_task[traced]["MessageAttributes"] == {
        "traceparent": {"DataType": "String", "StringValue": traceparent},
        "tracestate": {"DataType": "String", "StringValue": "vendor=1"},
    }
    assert by_task[partial]["MessageAttributes"] == {
        "traceparent": {"DataType": "String", "StringValue": traceparent},
    }
