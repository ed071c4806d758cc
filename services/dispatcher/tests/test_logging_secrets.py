"""The dispatcher's log lines: JSON, one event per transition with the task's identifiers, and
never a secret (an API key, the worker token, a wrong token someone presented, the database
password), through a full request cycle and through a database outage."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import pytest
import structlog
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from taskplat.common.logging import configure_logging
from taskplat.common.telemetry import Telemetry
from taskplat.testkit.dispatcher_calls import (
    claimed,
    complete,
    create_task,
    cursor_event,
    emit_events,
    heartbeat,
)
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, serve_dispatcher
from taskplat.testkit.testdb import with_database

DB_PASSWORD = "db-pa55word-never-logged"
WRONG_TOKEN = "wrong-token-someone-guessed-0123"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _with_password(url: str) -> str:
    """`url` with a password (the test server trusts local connections and ignores it)."""
    parts = urlsplit(url)
    netloc = f"{parts.username}:{DB_PASSWORD}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """Production logging (JSON lines, DEBUG, stdlib records included) into a buffer for one
    test; then the configuration that was. (`configure_logging` writes to the `sys.stderr` of the
    moment it runs, so the buffer stands in for it then.)"""
    saved = structlog.get_config()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        configure_logging("dispatcher", level="DEBUG", fmt="json")
    try:
        yield buffer
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def _lines(buffer: io.StringIO) -> tuple[str, list[dict[str, Any]]]:
    text = buffer.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    return text, [json.loads(line) for line in lines]  # every line is JSON


def _assert_no_secret(text: str) -> None:
    for secret in (API_KEY, WORKER_TOKEN, WRONG_TOKEN, DB_PASSWORD):
        assert secret not in text
    assert "Bearer" not in text and "authorization" not in text.lower()


def test_a_full_request_cycle_logs_transitions_and_no_secret(
    db_url: str, json_logs: io.StringIO
) -> None:
    telemetry = Telemetry("dispatcher", span_exporter=InMemorySpanExporter())
    try:
        with serve_dispatcher(_with_password(db_url), telemetry=telemetry) as dispatcher:
            created = dispatcher.api.post(
                "/tasks",
                json={"operator": "echo", "queue": "alpha", "config": {"n": 1}},
                headers={"traceparent": TRACEPARENT},
            )
            task_id = created.json()["task_id"]
            lease = claimed(dispatcher, task_id, worker_id="worker-7")
            assert heartbeat(dispatcher, lease).status_code == 200
            assert emit_events(dispatcher, lease, [cursor_event(1)]).status_code == 200
            assert complete(dispatcher, lease).status_code == 200
            assert heartbeat(dispatcher, lease).status_code == 409  # stale now
            headers = {"Authorization": f"Bearer {WRONG_TOKEN}"}
            wrong = dispatcher.anonymous.post(
                "/internal/task-claim",
                json={"task_id": task_id, "worker_id": "worker-7"},
                headers=headers,
            )
            assert wrong.status_code == 401
            assert dispatcher.anonymous.get("/tasks", headers=headers).status_code == 401
            assert create_task(dispatcher, queue="beta")["status"] == "Queued"
            assert dispatcher.anonymous.get("/metrics").status_code == 200
    finally:
        telemetry.shutdown()

    text, lines = _lines(json_logs)
    _assert_no_secret(text)
    assert all(line.get("service") == "dispatcher" for line in lines), lines
    by_event = {line["event"]: line for line in lines if line.get("task_id") == task_id}
    for event in ("task_created", "task_claimed", "task_completed"):
        line = by_event[event]
        assert line["attempt"] == 1 and line["queue"] == "alpha" and line["operator"] == "echo"
        assert line["level"] == "info" and "timestamp" in line
    assert by_event["task_claimed"]["worker_id"] == "worker-7"
    assert by_event["task_completed"]["worker_id"] == "worker-7"
    # The request's trace id is on its lines: logs and traces of one task join up.
    assert by_event["task_created"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    rejected = by_event["worker_call_rejected"]
    assert rejected["reason"] == "NotRunning" and rejected["attempt"] == 1
    unauthorized = [line for line in lines if line["event"] == "request_unauthorized"]
    assert {line["route"] for line in unauthorized} == {"/internal/task-claim", "/tasks"}
    # Nothing bound by one request leaks into the next one's lines.
    beta = [line for line in lines if line["event"] == "task_created" and line["queue"] == "beta"]
    assert len(beta) == 1 and beta[0]["task_id"] != task_id
    assert beta[0]["trace_id"] != by_event["task_created"]["trace_id"]  # its own new trace


def test_a_database_outage_logs_no_password(db_url: str, json_logs: io.StringIO) -> None:
    missing = _with_password(with_database(db_url, f"tp_missing_{uuid4().hex}"))
    with serve_dispatcher(missing, db_connect_timeout_seconds=0.5, db_pool_min_size=1) as broken:
        assert broken.api.get("/tasks").status_code == 503
        assert broken.anonymous.get("/readyz").status_code == 503
        assert broken.anonymous.get("/metrics").status_code == 200

    text, lines = _lines(json_logs)
    _assert_no_secret(text)
    events = {line["event"] for line in lines}
    assert {"database_unavailable", "metrics_refresh_failed"} <= events, events


def test_a_bulk_create_logs_one_task_created_line_per_task_it_created(
    db_url: str, json_logs: io.StringIO
) -> None:
    telemetry = Telemetry("dispatcher", span_exporter=InMemorySpanExporter())
    try:
        with serve_dispatcher(db_url, telemetry=telemetry) as dispatcher:
            taken = create_task(dispatcher, queue="alpha", idempotency_key="taken")["task_id"]
            response = dispatcher.api.post(
                "/tasks/batch",
                json={
                    "tasks": [
                        {"operator": "echo", "queue": "alpha"},
                        {"operator": "echo", "queue": "alpha", "idempotency_key": "taken"},
                        {
                            "operator": "sleep",
                            "queue": "beta",
                            "scheduled_for": "2999-01-01T00:00:00Z",
                        },
                    ]
                },
                headers={"traceparent": TRACEPARENT},
            )
            assert response.status_code == 201, response.text
    finally:
        telemetry.shutdown()
    results = response.json()["results"]
    _, lines = _lines(json_logs)
    created = [line for line in lines if line["event"] == "task_created"]
    assert [line["task_id"] for line in created] == [
        taken,
        results[0]["task"]["task_id"],
        results[2]["task"]["task_id"],
    ]
    first, scheduled = created[1:]
    assert first["status"] == "Queued" and scheduled["status"] == "Scheduled"
    assert (first["queue"], first["operator"], first["attempt"]) == ("alpha", "echo", 1)
    assert (scheduled["queue"], scheduled["operator"]) == ("beta", "sleep")
    for line in created[1:]:
        assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert line["service"] == "dispatcher" and line["level"] == "info"
        assert "worker_id" not in line


def test_a_completion_batch_with_claim_next_logs_a_line_per_completion_and_claim(
    db_url: str, json_logs: io.StringIO
) -> None:
    with serve_dispatcher(db_url) as dispatcher:
        done = [claimed(dispatcher, create_task(dispatcher, queue="q1")["task_id"], "w-1")]
        done.append(claimed(dispatcher, create_task(dispatcher, queue="q1")["task_id"], "w-1"))
        queued = [create_task(dispatcher, queue="q2")["task_id"] for _ in range(2)]
        response = dispatcher.worker.post(
            "/internal/task-complete-batch",
            json={
                "completions": [
                    {**done[0].fence(), "status": "Completed"},
                    {**done[1].fence(), "status": "Failed", "error_message": "boom"},
                ],
                "claim_next": {"worker_id": "w-2", "queue": "q2", "max": 4},
            },
        )
        assert response.status_code == 200, response.text
    _, lines = _lines(json_logs)
    by_task = {
        (line["event"], line["task_id"]): line
        for line in lines
        if line["event"] in ("task_completed", "task_failed", "task_claimed")
    }
    completed = by_task["task_completed", done[0].task_id]
    assert completed["late"] is False and completed["worker_id"] == "w-1"
    assert completed["run_time_seconds"] >= 0 and completed["queue"] == "q1"
    failed = by_task["task_failed", done[1].task_id]
    assert failed["reason"] == "Reported" and failed["next_retry_at"] is not None
    for task_id in queued:
        line = by_task["task_claimed", task_id]
        assert line["worker_id"] == "w-2" and line["attempt"] == 1 and line["queue"] == "q2"
        assert line["schedule_lag_seconds"] >= 0 and line["level"] == "info"
        assert line["service"] == "dispatcher" and "timestamp" in line
