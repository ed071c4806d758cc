"""Unit tests: turning outbox rows into SQS messages, chunking them, and the relay's settings."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from taskplat.common.contracts.messages import DeadLetterRecord
from taskplat.common.sqs import wake_up_body
from taskplat.outbox_relay.messages import (
    MAX_BATCH_BYTES,
    OutgoingMessage,
    UnsendableRow,
    build_message,
    chunk_messages,
    trace_attributes,
)
from taskplat.outbox_relay.outbox import OutboxRow
from taskplat.outbox_relay.settings import RelaySettings

SETTINGS = RelaySettings(sqs_queue_prefix="p-", dead_letter_queue_name="p-dead")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _row(kind: Any = "enqueue_task", **changes: Any) -> OutboxRow:
    task_id = changes.pop("task_id", uuid4())
    values: dict[str, Any] = {
        "outbox_id": 1,
        "kind": kind,
        "task_id": task_id,
        "queue": "default",
        "payload": {"task_id": str(task_id)},
        "trace_context": None,
        "send_attempts": 0,
    }
    values.update(changes)
    return OutboxRow(**values)


def _dead_payload(task_id: Any) -> dict[str, Any]:
    return {
        "task_id": str(task_id),
        "queue": "default",
        "operator": "echo",
        "attempt": 3,
        "max_attempts": 3,
        "dead_reason": "AttemptsExhausted",
        "last_error": None,
        "died_at": "2030-01-01T00:00:00+00:00",
    }


def test_a_wakeup_goes_to_the_prefixed_queue_with_the_exact_body() -> None:
    row = _row(outbox_id=42, queue="gpu")
    assert build_message(row, SETTINGS) == OutgoingMessage(42, "p-gpu", wake_up_body(row.task_id))


def test_a_dead_letter_is_a_validated_record_sent_to_the_dead_letter_queue() -> None:
    task_id = uuid4()
    message = build_message(
        _row("dead_letter", task_id=task_id, payload=_dead_payload(task_id)), SETTINGS
    )
    assert message.queue_name == "p-dead"
    record = DeadLetterRecord.model_validate_json(message.body)
    assert record.task_id == task_id
    assert record.died_at == datetime(2030, 1, 1, tzinfo=UTC)


def test_a_resolved_record_goes_to_the_dead_letter_queue_too() -> None:
    task_id = uuid4()
    payload = {
        **_dead_payload(task_id),
        "record": "resolved",
        "resolved_at": "2030-01-01T00:05:00+00:00",
    }
    message = build_message(_row("dead_letter", task_id=task_id, payload=payload), SETTINGS)
    assert message.queue_name == "p-dead"
    record = DeadLetterRecord.model_validate_json(message.body)
    assert (record.record, record.task_id) == ("resolved", task_id)
    assert record.resolved_at == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    plain = build_message(
        _row("dead_letter", task_id=task_id, payload=_dead_payload(task_id)), SETTINGS
    )
    assert DeadLetterRecord.model_validate_json(plain.body).record == "dead"


@pytest.mark.parametrize(
    ("payload_change", "error"),
    [
        (
            {"operator": None},
            "invalid dead-letter payload: operator: Input should be a valid string",
        ),
        ({"surprise": 1}, "invalid dead-letter payload: surprise: Extra inputs are not permitted"),
        ({"task_id": "00000000-0000-0000-0000-000000000000"}, "dead-letter payload names task"),
    ],
)
def test_a_malformed_dead_letter_payload_is_unsendable(
    payload_change: dict[str, Any], error: str
) -> None:
    task_id = uuid4()
    payload = {**_dead_payload(task_id), **payload_change}
    with pytest.raises(UnsendableRow) as raised:
        build_message(_row("dead_letter", task_id=task_id, payload=payload), SETTINGS)
    assert raised.value.message.startswith(error)


def test_an_unknown_kind_is_unsendable() -> None:
    with pytest.raises(UnsendableRow, match="unknown outbox kind 'carrier_pigeon'"):
        build_message(_row("carrier_pigeon"), SETTINGS)


@pytest.mark.parametrize(
    ("trace_context", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"traceparent": TRACEPARENT}, {"traceparent": TRACEPARENT}),
        (
            {"traceparent": TRACEPARENT, "tracestate": "a=1", "baggage": "x=y"},
            {"traceparent": TRACEPARENT, "tracestate": "a=1"},
        ),
        ({"traceparent": "", "tracestate": 7}, {}),
    ],
)
def test_trace_attributes_carry_only_w3c_string_fields(
    trace_context: dict[str, Any] | None, expected: dict[str, str]
) -> None:
    assert trace_attributes(trace_context) == {
        name: {"DataType": "String", "StringValue": value} for name, value in expected.items()
    }


def test_a_traced_row_keeps_its_body_and_carries_the_attributes() -> None:
    row = _row(trace_context={"traceparent": TRACEPARENT})
    message = build_message(row, SETTINGS)
    assert message.body == wake_up_body(row.task_id)
    assert message.attributes == {"traceparent": {"DataType": "String", "StringValue": TRACEPARENT}}


def _messages(
    queue: str, count: int, *, body: str = "{}", first_id: int = 1
) -> list[OutgoingMessage]:
    return [OutgoingMessage(first_id + i, queue, body) for i in range(count)]


def test_chunks_hold_at_most_ten_messages_of_one_queue_in_order() -> None:
    messages = _messages("a", 23) + _messages("b", 3, first_id=100)
    chunks = list(chunk_messages(messages))
    assert [[m.outbox_id for m in chunk] for chunk in chunks] == [
        list(range(1, 11)),
        list(range(11, 21)),
        [21, 22, 23],
        [100, 101, 102],
    ]


def test_chunks_stay_under_the_batch_size_limit() -> None:
    body = "x" * (MAX_BATCH_BYTES // 3)
    chunks = list(chunk_messages(_messages("a", 7, body=body)))
    assert [len(chunk) for chunk in chunks] == [3, 3, 1]
    assert all(sum(m.size for m in chunk) <= MAX_BATCH_BYTES for chunk in chunks)


def test_settings_defaults_and_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BATCH_SIZE", "INTERVAL_SECONDS", "SEND_CONCURRENCY"):
        monkeypatch.delenv(f"TASKPLAT_RELAY_{name}", raising=False)
    defaults = RelaySettings()
    assert (defaults.batch_size, defaults.interval_seconds, defaults.send_concurrency) == (
        100,
        1.0,
        4,
    )
    monkeypatch.setenv("TASKPLAT_RELAY_BATCH_SIZE", "7")
    monkeypatch.setenv("TASKPLAT_RELAY_INTERVAL_SECONDS", "2.5")
    monkeypatch.setenv("TASKPLAT_SQS_QUEUE_PREFIX", "env-")
    configured = RelaySettings()
    assert (configured.batch_size, configured.interval_seconds) == (7, 2.5)
    assert configured.sqs_queue_prefix == "env-"


def test_settings_reject_a_retry_cap_below_the_base() -> None:
    with pytest.raises(ValidationError, match="retry_max_seconds must be >= retry_base_seconds"):
        RelaySettings(retry_base_seconds=10, retry_max_seconds=1)
