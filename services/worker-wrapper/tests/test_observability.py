"""The wrapper's metrics, traces, logs and health against a real dispatcher and a real SQS queue."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psycopg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import SecretStr
from wrapper_harness import (
    WORKER_TOKEN,
    Dispatcher,
    Queue,
    running_wrapper,
    spawn_wrapper,
    wrapper_env,
)
from wrapper_metrics import by_label, value

from taskplat.common.telemetry import Telemetry
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.worker_wrapper.dispatcher_client import DispatcherClient, DispatcherUnavailable
from taskplat.worker_wrapper.observability import SERVICE, WrapperTelemetry

CLAIM = "/internal/task-claim"
COMPLETE = "/internal/task-complete"


def test_metrics_count_a_known_workload(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    telemetry = Telemetry(SERVICE)
    echoes = [dispatcher.create("echo", config={"n": n}) for n in (1, 2)]
    crash = dispatcher.create("crash", max_attempts=1)
    settings = {
        # One completion call per task: no linger for the others (`test_batching` covers that).
        "complete_linger_seconds": 0,
        # Each message is received exactly once: with the default 1 s receive visibility, a busy
        # machine can delay the early renewal past it and SQS then delivers the message again
        # (answered NotClaimed: correct, but not this test's workload; `test_receive_visibility`
        # covers the short timeout).
        "receive_visibility_timeout_seconds": 30,
        "visibility_timeout_seconds": 30,
    }
    with running_wrapper(dispatcher, queue, operators_file, telemetry, **settings):
        for task in [*echoes, crash]:
            queue.wake(task["task_id"])
        queue.send("not json at all")
        for task in echoes:
            dispatcher.wait_status(task["task_id"], "Completed")
        dispatcher.wait_status(crash["task_id"], "Dead")
        queue.wait_empty()
        queue.wake(echoes[0]["task_id"])  # a duplicate wake-up of a finished task
        queue.wait_empty()
    text = telemetry.prometheus_text()

    assert by_label(text, "taskplat_sqs_received_total", "queue") == {"default": 5}
    deleted = by_label(text, "taskplat_sqs_deleted_total", "why", queue="default")
    assert deleted == {"completed": 3, "poison": 1, "not_claimed": 1}
    claims = by_label(text, "taskplat_worker_claims_total", "result", queue="default")
    assert claims == {"Claimed": 3, "Completed": 1}
    starts = by_label(text, "taskplat_operator_starts_total", "operator")
    assert starts == {"echo": 1, "crash": 1}
    assert value(text, "taskplat_operator_starts_total", operator="echo", mode="pooled") == 1
    assert value(text, "taskplat_operator_starts_total", operator="crash", mode="per-task") == 1
    assert by_label(text, "taskplat_operator_crashes_total", "operator") == {"crash": 1}
    tasks = by_label(text, "taskplat_worker_tasks_total", "outcome", operator="echo")
    assert tasks == {"Completed": 2}
    tasks = by_label(text, "taskplat_worker_tasks_total", "outcome", operator="crash")
    assert tasks == {"Failed": 1}
    run_time = "taskplat_operator_run_time_seconds_count"
    assert value(text, run_time, operator="echo", outcome="Completed") == 2
    assert value(text, run_time, operator="crash", outcome="Failed") == 1
    assert value(text, "taskplat_worker_busy") == 0
    assert value(text, "taskplat_dispatcher_calls_total", route=CLAIM, status="200") == 4
    assert value(text, "taskplat_dispatcher_calls_total", route=COMPLETE, status="200") == 3
    assert value(text, "taskplat_dispatcher_call_errors_total") == 0
    assert value(text, "taskplat_sqs_errors_total") == 0
    assert value(text, "taskplat_operator_kills_total") == 0


def pid_of(pid_file: Path) -> int:
    def read() -> str:
        return pid_file.read_text().strip() if pid_file.exists() else ""

    return int(wait_for(read, timeout=10, what=f"the operator to write {pid_file.name}"))


def test_kills_are_counted_by_reason_and_a_saturated_wrapper_stays_healthy(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path, db_url: str
) -> None:
    telemetry = Telemetry(SERVICE)
    files = {name: tmp_path / f"{name}.pid" for name in ("deadline", "cancel", "lease")}
    deadline = dispatcher.create(
        "hang", config={"pid_file": str(files["deadline"])}, timeout_seconds=1, max_attempts=1
    )
    cancel = dispatcher.create("hang", config={"pid_file": str(files["cancel"])})
    lease = dispatcher.create("hang", config={"pid_file": str(files["lease"])})
    settings = {"concurrency": 2, "stall_seconds": 2.0}
    with running_wrapper(dispatcher, queue, operators_file, telemetry, **settings) as wrapper:
        assert wrapper.wrapper is not None
        health = wrapper.wrapper.health
        queue.wake(deadline["task_id"])
        dispatcher.wait_status(deadline["task_id"], "Dead")
        queue.wake(cancel["task_id"])
        queue.wake(lease["task_id"])
        for name in ("cancel", "lease"):
            pid_of(files[name])
        # Both slots are busy, so no receive polls: the intake loop still shows progress.
        assert value(telemetry.prometheus_text(), "taskplat_worker_busy") == 2
        until = time.monotonic() + 3
        while time.monotonic() < until:
            healthy, reason = health.check(2.0)
            assert healthy, reason
            wait_for(lambda: True, timeout=0.2, what="a pause")
        dispatcher.cancel(cancel["task_id"])
        with psycopg.connect(db_url, autocommit=True) as conn:  # another holder took the lease
            conn.execute(
                "UPDATE tasks SET lease_token = gen_random_uuid() WHERE task_id = %s",
                (lease["task_id"],),
            )
        queue.wait_empty(timeout=15)
    assert health.check(2.0) == (True, "draining")
    text = telemetry.prometheus_text()

    kills = by_label(text, "taskplat_operator_kills_total", "reason", operator="hang")
    assert kills == {"deadline": 1, "canceled": 1, "lease_lost": 1}
    tasks = by_label(text, "taskplat_worker_tasks_total", "outcome", operator="hang")
    assert tasks == {"Failed": 1, "Canceled": 1, "Stopped": 1}
    deleted = by_label(text, "taskplat_sqs_deleted_total", "why")
    assert deleted == {"completed": 2, "rejected": 1}
    assert value(text, "taskplat_operator_starts_total", operator="hang", mode="per-task") == 3
    assert value(text, "taskplat_operator_crashes_total") == 0
    assert value(text, "taskplat_worker_busy") == 0


def traceparent_parts(traceparent: str) -> tuple[int, int]:
    """(trace id, parent span id) of a W3C `traceparent`."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16)


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    assert parent.context is not None
    return {
        span.name: span
        for span in spans
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    }


def test_a_task_attempt_continues_the_trace_of_its_message(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(SERVICE, span_exporter=exporter)
    sent: dict[str, str] = {}
    tasks = {operator: dispatcher.create(operator) for operator in ("trace", "trace-pooled")}
    # Each completion its own call, in its attempt's trace (a batch call is no one's child).
    with running_wrapper(dispatcher, queue, operators_file, telemetry, complete_linger_seconds=0):
        for task in tasks.values():
            traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
            sent[task["task_id"]] = traceparent
            queue.client.send_message(
                QueueUrl=queue.url,
                MessageBody=json.dumps({"task_id": task["task_id"]}),
                MessageAttributes={
                    "traceparent": {"DataType": "String", "StringValue": traceparent}
                },
            )
        done = {
            operator: dispatcher.wait_status(task["task_id"], "Completed")
            for operator, task in tasks.items()
        }
        queue.wait_empty()
    telemetry.force_flush()
    spans = list(exporter.get_finished_spans())

    for operator, task in done.items():
        trace_id, message_span = traceparent_parts(sent[task["task_id"]])
        attempts = [
            span
            for span in spans
            if span.name == "task.attempt"
            and span.context is not None
            and span.context.trace_id == trace_id
        ]
        assert len(attempts) == 1, [span.name for span in spans]
        attempt = attempts[0]
        assert attempt.kind == SpanKind.CONSUMER
        assert attempt.parent is not None and attempt.parent.span_id == message_span
        assert attempt.attributes is not None
        assert attempt.attributes["taskplat.task_id"] == task["task_id"]
        assert attempt.attributes["taskplat.result"] == "Completed"
        steps = children(spans, attempt)
        assert {"dispatcher.claim", "operator.run", "dispatcher.complete"} <= set(steps)
        assert steps["dispatcher.claim"].kind == SpanKind.CLIENT
        claim_attributes = steps["dispatcher.claim"].attributes or {}
        assert claim_attributes["http.response.status_code"] == 200
        run_span = steps["operator.run"].context
        assert run_span is not None
        # The operator was handed the operator.run span as its parent.
        result = task["result"]
        given = result["env"] if operator == "trace" else result["document"]
        assert traceparent_parts(given) == (trace_id, run_span.span_id)
        assert result["sdk"] == given
        assert result["document" if operator == "trace" else "env"] is None


class _RecordingHandler(BaseHTTPRequestHandler):
    """A stand-in dispatcher: answers every claim `NotClaimed` and records the headers."""

    seen: ClassVar[list[dict[str, str]]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append({key.lower(): value for key, value in self.headers.items()})
        body = b'{"status": "NotClaimed", "reason": "NotFound"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_dispatcher_calls_carry_their_span_and_are_counted() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(SERVICE, span_exporter=exporter)

    class Handler(_RecordingHandler):
        seen: ClassVar[list[dict[str, str]]] = []

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    instruments = WrapperTelemetry(telemetry)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        port = server.server_address[1]
        served = DispatcherClient(
            f"http://127.0.0.1:{port}", SecretStr(WORKER_TOKEN), telemetry=instruments
        )
        unreachable = DispatcherClient(
            f"http://127.0.0.1:{free_port()}",
            SecretStr(WORKER_TOKEN),
            retry_base_seconds=0.05,
            retry_max_seconds=0.1,
            telemetry=instruments,
        )
        try:
            await served.claim(uuid.uuid4(), "w", until=loop.time() + 5)
            try:
                await unreachable.claim(uuid.uuid4(), "w", until=loop.time() + 0.3)
            except DispatcherUnavailable:
                pass
        finally:
            await served.aclose()
            await unreachable.aclose()

    try:
        asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    telemetry.force_flush()
    claims = [span for span in exporter.get_finished_spans() if span.name == "dispatcher.claim"]
    assert len(claims) == 2
    headers = Handler.seen[0]
    assert headers["authorization"] == f"Bearer {WORKER_TOKEN}"
    first = claims[0].context
    assert first is not None
    assert traceparent_parts(headers["traceparent"]) == (first.trace_id, first.span_id)
    text = telemetry.prometheus_text()
    assert value(text, "taskplat_dispatcher_calls_total", route=CLAIM, status="200") == 1
    assert value(text, "taskplat_dispatcher_call_errors_total", route=CLAIM) >= 1


def _get(client: httpx.Client, path: str) -> httpx.Response | None:
    try:
        return client.get(path)
    except httpx.HTTPError:
        return None


def _status(client: httpx.Client, path: str) -> int:
    response = _get(client, path)
    return response.status_code if response is not None else 0


def log_events(log_path: Path) -> list[dict[str, Any]]:
    events = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def test_a_wrapper_process_serves_metrics_and_health_and_logs_each_transition(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    healthy_port, stalled_port = free_port(), free_port()
    env = wrapper_env(dispatcher, queue, operators_file)
    env.update(TASKPLAT_WORKER_OPS_PORT=str(healthy_port), TASKPLAT_LOG_FORMAT="json")
    stalled_env = {
        **env,
        "SQS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "TASKPLAT_WORKER_OPS_PORT": str(stalled_port),
        "TASKPLAT_WORKER_STALL_SECONDS": "2",
    }
    task = dispatcher.create("echo", config={"hello": "metrics"})
    wrapper = spawn_wrapper(env, tmp_path / "healthy")
    stalled = spawn_wrapper(stalled_env, tmp_path / "stalled")
    ops = httpx.Client(base_url=f"http://127.0.0.1:{healthy_port}", timeout=5)
    stalled_ops = httpx.Client(base_url=f"http://127.0.0.1:{stalled_port}", timeout=5)
    try:
        wait_for(lambda: _status(ops, "/healthz") == 200, timeout=30, what="/healthz 200")
        queue.wake(task["task_id"])
        dispatcher.wait_status(task["task_id"], "Completed", timeout=30)

        def completed_count() -> float:
            response = _get(ops, "/metrics")
            assert response is not None and response.status_code == 200
            return value(
                response.text, "taskplat_worker_tasks_total", operator="echo", outcome="Completed"
            )

        wait_for(lambda: completed_count() == 1, timeout=10, what="the completion to be counted")
        assert ops.get("/healthz").json()["status"] == "ok"

        # The other wrapper's intake cannot reach SQS: its /healthz turns 503.
        wait_for(lambda: _status(stalled_ops, "/healthz") == 503, timeout=30, what="/healthz 503")
        assert "no SQS receive completed" in stalled_ops.get("/healthz").json()["reason"]
        errors = stalled_ops.get("/metrics").text
        assert value(errors, "taskplat_sqs_errors_total", queue="default", op="receive") >= 1

        wrapper.popen.send_signal(signal.SIGTERM)
        assert wrapper.wait(20), wrapper.tail()
        assert wrapper.popen.returncode == 0, wrapper.tail()
    finally:
        ops.close()
        stalled_ops.close()
        wrapper.stop_group(timeout=10)
        stalled.stop_group(sig=signal.SIGKILL, timeout=10)  # nothing to drain

    log_text = (tmp_path / "healthy" / "wrapper.log").read_text(encoding="utf-8")
    assert WORKER_TOKEN not in log_text
    events = log_events(tmp_path / "healthy" / "wrapper.log")
    mine = [event for event in events if event.get("task_id") == task["task_id"]]
    names = [event["event"] for event in mine]
    for name in ("task_claimed", "operator_started", "task_completed", "message_deleted"):
        assert name in names, names
    for event in mine:
        if event["event"] in ("task_claimed", "operator_started", "task_completed"):
            assert event["service"] == SERVICE
            assert event["attempt"] == 1
            assert event["queue"] == "default"
            assert event["operator"] == "echo"
            assert event["worker_id"]
    deletion = next(event for event in mine if event["event"] == "message_deleted")
    assert deletion["why"] == "completed"
