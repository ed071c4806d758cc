"""The stdout line protocol, the operator SDK and the deadline rule, without processes."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta

from taskplat.common.contracts import ClaimedResponse, ClaimTask
from taskplat.worker_wrapper.attempt import effective_deadline
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import failure
from taskplat.worker_wrapper.protocol import ProtocolError, ResultEnvelope, parse_line
from taskplat.worker_wrapper.sdk import OperatorFailure, Result, Task, serve

NOW = datetime(2030, 1, 1, tzinfo=UTC)
EVENT = {
    "dataset_uuid": "00000000-0000-4000-8000-000000000001",
    "dataset_version": "00000000-0000-4000-8000-000000000002",
    "cursor": 7,
}


def test_lines_are_classified() -> None:
    assert parse_line(b"hello\n") is None
    assert parse_line(b"[1, 2]\n") is None
    assert parse_line(b'{"other": 1}\n') is None
    assert parse_line(b"   \n") is None
    events = parse_line(json.dumps({"event": EVENT}).encode())
    assert isinstance(events, list) and events[0].cursor == 7
    batch = parse_line(json.dumps({"events": [EVENT, {**EVENT, "cursor": 8}]}).encode())
    assert isinstance(batch, list) and [e.cursor for e in batch] == [7, 8]
    envelope = parse_line(b'{"status": "succeeded", "payload": {"a": 1}}')
    assert isinstance(envelope, ResultEnvelope) and envelope.succeeded
    assert envelope.payload == {"a": 1}


def test_malformed_protocol_lines_are_errors() -> None:
    lines: list[dict[str, object]] = [
        {"event": {"dataset_uuid": "nope"}},
        {"events": []},
        {"event": EVENT, "extra": 1},
        {"status": "succeeded", "payload": [1]},
        {"status": "succeeded", "outputs": [{"output_index": -1}]},
        {"status": "succeeded", "surprise": True},
    ]
    for line in lines:
        assert isinstance(parse_line(json.dumps(line).encode()), ProtocolError), line


# The required fields of a task line (the contracts' `TaskLine` schema), for the tests' lines.
LINE: dict[str, object] = {
    "lease_token": "l",
    "operator": "op",
    "queue": "default",
    "config": {},
    "inputs": [],
    "job": None,
    "timeout_seconds": None,
    "deadline_at": None,
}


def serve_lines(handler: object, *tasks: dict[str, object]) -> list[dict[str, object]]:
    stdin = io.StringIO("".join(json.dumps({**LINE, **task}) + "\n" for task in tasks))
    stdout = io.StringIO()
    assert serve(handler, stdin=stdin, stdout=stdout) == 0  # type: ignore[arg-type]
    return [json.loads(line) for line in stdout.getvalue().splitlines()]


def test_sdk_answers_each_task_and_keeps_prints_off_stdout() -> None:
    def handler(task: Task) -> dict[str, object]:
        print("a stray print")  # must not reach the protocol stream
        if task.config.get("fail"):
            raise OperatorFailure("told to fail")
        if task.config.get("crash"):
            raise KeyError("missing")
        return {"attempt": task.attempt}

    answers = serve_lines(
        handler,
        {"task_id": "t1", "attempt": 1, "config": {}},
        {"task_id": "t2", "attempt": 2, "config": {"fail": True}},
        {"task_id": "t3", "attempt": 3, "config": {"crash": True}},
    )
    assert answers == [
        {"status": "succeeded", "payload": {"attempt": 1}},
        {"status": "failed", "error": "told to fail"},
        {"status": "failed", "error": "KeyError: 'missing'"},
    ]


def test_sdk_full_result_and_unserialisable_payload() -> None:
    answers = serve_lines(
        lambda task: Result({"ok": True}, events=[EVENT]) if task.attempt == 1 else {"x": {1, 2}},
        {"task_id": "t1", "attempt": 1},
        {"task_id": "t1", "attempt": 2},
    )
    assert answers[0] == {"status": "succeeded", "payload": {"ok": True}, "events": [EVENT]}
    assert answers[1]["status"] == "failed" and "not JSON" in str(answers[1]["error"])


def claimed(deadline_at: datetime | None, timeout_seconds: int | None) -> ClaimedResponse:
    task_id = uuid.uuid4()
    return ClaimedResponse(
        attempt=1,
        lease_token=uuid.uuid4(),
        lease_expires_at=NOW + timedelta(seconds=30),
        attempt_token="header.claims.signature",
        task=ClaimTask(
            task_id=task_id,
            attempt=1,
            job=None,
            operator="op",
            queue="default",
            config={},
            inputs=[],
            timeout_seconds=timeout_seconds,
            deadline_at=deadline_at,
        ),
    )


def test_operator_timeout_applies_only_when_the_task_set_none_and_it_is_sooner() -> None:
    spec = OperatorSpec(command=["x"], timeout_seconds=60)
    far = NOW + timedelta(hours=1)
    near = NOW + timedelta(seconds=10)
    assert effective_deadline(claimed(far, None), spec, NOW) == NOW + timedelta(seconds=60)
    assert effective_deadline(claimed(near, None), spec, NOW) == near
    assert effective_deadline(claimed(far, 3600), spec, NOW) == far  # the task's own timeout
    assert effective_deadline(claimed(far, None), OperatorSpec(command=["x"]), NOW) == far
    assert effective_deadline(claimed(None, None), spec, NOW) == NOW + timedelta(seconds=60)
    assert effective_deadline(claimed(far, None), None, NOW) == far


def test_an_envelope_whose_payload_cannot_be_stored_is_a_protocol_error() -> None:
    for line in (
        b'{"status": "succeeded", "payload": {"x": NaN}}\n',
        b'{"status": "succeeded", "payload": {"x": "a\\u0000b"}}\n',
    ):
        parsed = parse_line(line)
        assert isinstance(parsed, ProtocolError), line
        assert "invalid result envelope" in parsed.message


def test_a_failure_message_never_carries_nul_characters() -> None:
    failed = failure("exit 1\x00", stderr_tail="bad\x00byte\n")
    assert "\x00" not in failed.error_message
    assert "bad\\0byte" in failed.error_message
