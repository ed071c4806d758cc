"""The log lines `configure_logging` writes are the ones structlog's separate processors wrote
(contextvars, level, ISO UTC timestamp, secrets masked, stack and exception rendered, JSON), key
for key and in the same order: the one-processor chain only makes each line cheaper. And
`get_logger` follows a reconfiguration."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog

from taskplat.common.logging import (
    configure_logging,
    get_logger,
    info_events,
    info_lines,
    mask_secrets,
)

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def configured() -> Iterator[None]:
    saved = structlog.get_config()
    configure_logging("logging-test", level="DEBUG", fmt="json")
    try:
        yield
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.configure(**saved)


def _former_chain() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        mask_secrets,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(),
    ]


def _lines(processors: list[Any]) -> list[dict[str, Any]]:
    logger = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    structlog.contextvars.bind_contextvars(task_id="t-1", attempt=2, queue="bound")
    rendered = [
        logger.info("task_claimed", queue="given", schedule_lag_seconds=0.25, worker_id="w"),
        logger.warning("secret_fields", api_token="abc", password="pw", lease_token="keep"),
        logger.info(
            "odd_values", task=uuid.UUID(int=1), at=datetime(2026, 1, 2, tzinfo=UTC), text="é"
        ),
        logger.info("with_stack", stack_info=True),
    ]
    try:
        raise ValueError("boom")
    except ValueError:
        rendered.append(logger.exception("failed"))
    lines = [json.loads(line) for line in rendered]
    for line in lines:
        assert TIMESTAMP.match(line.pop("timestamp")), line
    # The stack differs by the line it was taken on; its presence and start are compared.
    lines[3]["stack"] = lines[3]["stack"].splitlines()[0]
    return lines


def test_lines_are_the_former_chain_s_key_for_key(configured: None) -> None:
    now = _lines(list(structlog.get_config()["processors"]))
    former = _lines(_former_chain())
    assert now == former
    assert [list(line) for line in now] == [list(line) for line in former]  # key order too
    assert now[0]["queue"] == "given" and now[0]["task_id"] == "t-1"
    assert now[1]["api_token"] == "***" and now[1]["lease_token"] == "keep"
    assert now[1]["level"] == "warning"
    assert "ValueError: boom" in now[4]["exception"]


def test_get_logger_follows_a_reconfiguration(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("logging-test", level="INFO", fmt="json")
    get_logger().info("one")
    get_logger().debug("filtered")
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    configure_logging("logging-test", level="DEBUG", fmt="json")
    get_logger().debug("two")
    with structlog.testing.capture_logs() as captured:
        get_logger().info("three")
    assert [json.loads(line)["event"] for line in first.getvalue().splitlines()] == ["one"]
    assert [json.loads(line)["event"] for line in second.getvalue().splitlines()] == ["two"]
    assert [entry["event"] for entry in captured] == ["three"]


def _written(monkeypatch: pytest.MonkeyPatch, log: Any) -> list[dict[str, Any]]:
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buffer)
    configure_logging("logging-test", level="INFO", fmt="json")
    structlog.contextvars.bind_contextvars(trace_id="t-9", queue="bound", api_key="k")
    log()
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_info_events_writes_the_lines_of_one_call_per_line(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields: list[dict[str, Any]] = [
        {"status": "Queued", "task_id": "t-1", "attempt": 1, "queue": "a", "operator": "echo"},
        {"status": "Scheduled", "task_id": "t-2", "attempt": 1, "queue": "b", "operator": "x"},
        {"task_id": "t-3", "secret_value": "s", "level": "mine", "task": uuid.UUID(int=3)},
    ]

    events = ["task_created", "task_claimed", "task_created"]

    def one_by_one() -> None:
        for event, each in zip(events, fields, strict=True):
            get_logger().info(event, **each)

    def together() -> None:
        info_events(zip(events, fields, strict=True))

    each, batched = _written(monkeypatch, one_by_one), _written(monkeypatch, together)
    for line in (*each, *batched):
        assert TIMESTAMP.match(line.pop("timestamp")), line
    assert batched == each
    assert [list(line) for line in batched] == [list(line) for line in each]  # key order too
    assert batched[0]["queue"] == "a" and batched[0]["trace_id"] == "t-9"
    assert batched[2]["secret_value"] == "***" and batched[2]["api_key"] == "***"
    assert batched[2]["level"] == "info"


def test_info_lines_follows_another_configuration(configured: None) -> None:
    with structlog.testing.capture_logs() as captured:
        info_lines("task_created", [{"task_id": "t-1"}, {"task_id": "t-2"}])
    assert [(entry["event"], entry["task_id"]) for entry in captured] == [
        ("task_created", "t-1"),
        ("task_created", "t-2"),
    ]
