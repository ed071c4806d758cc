"""Lambda invocations through the real relay invoker, a real dispatcher and real function
processes: `LocalLambda` serves the Invoke API the invoker's boto3 client calls and the Runtime API
the real `awslambdaric` client polls; the function runs `lambda_probe` under
`taskplat_handler`. Covered: the wake-up kind, success with events, operator failure, a
permanent failure (Dead at once, attempts left notwithstanding), a timeout
close to the function's limit, a throttled Invoke retried with backoff, a relay that dies between
Invoke and commit (that invocation runs nothing; the next one runs the attempt), a duplicate
delivery of an attempt and a stale attempt (both refused, nothing changes), and a relay without
signing keys (nothing claimed)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool
from pydantic import SecretStr
from relay_harness import Queues, Rows, make_settings, metric_lines

from taskplat.common.db.notify import INVOKE_CHANNEL
from taskplat.common.telemetry import Telemetry
from taskplat.common.tokens.attempt import attempt_key_ring, verify_attempt_token
from taskplat.common.tokens.capability import capability_key_ring, verify_capability_token
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.devstack.lambda_endpoint import Invocation, LocalLambda
from taskplat.devstack.waiting import wait_for
from taskplat.outbox_relay.lambda_invoker import NO_CAPABILITY_KEYS, NO_KEYS, Invoker, lambda_client
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.dispatcher_rows import task_xmin

KEYS = {"k1": private_key_pem(b"\x21" * 32)}
TESTS_DIR = Path(__file__).parent
DAG = {
    "jobs": {
        "probe": {"operator": "probe", "runtime": "lambda", "timeout_seconds": 30,
                  "max_attempts": 2, "outputs": [{"index": 0, "dataset": "probed"}]},
        "once": {"operator": "probe", "runtime": "lambda", "timeout_seconds": 30,
                 "max_attempts": 1},
        "slow": {"operator": "slow", "runtime": "lambda", "timeout_seconds": 4},
        "worker": {"operator": "echo"},
        "sandboxed": {"operator": "probe", "runtime": "lambda", "timeout_seconds": 30,
                      "trust": "untrusted", "inputs": [{"from": {"dataset": "probed"}}]},
    }
}  # fmt: skip
CAPABILITY_KEYS = {"c1": private_key_pem(b"\x22" * 32)}
FINISHED = ("succeeded", "error", "crashed", "timed_out")


LAMBDA_OVERRIDES: dict[str, object] = {
    "attempt_token_keys": KEYS,
    "attempt_token_active_kid": "k1",
    "capability_token_keys": CAPABILITY_KEYS,
    "capability_token_active_kid": "c1",
    "lambda_function_prefix": "tp-",
    "lambda_grace_seconds": 5,
}


@pytest.fixture
def relay_overrides() -> dict[str, object]:
    return LAMBDA_OVERRIDES


@pytest.fixture
def d(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(
        db_url,
        attempt_token_keys=KEYS,
        attempt_token_active_kid="k1",
        capability_token_keys=json.dumps(CAPABILITY_KEYS),
        capability_token_active_kid="c1",
    ) as d:
        assert d.api.put("/dags/d", json=DAG).status_code == 201
        yield d


@pytest.fixture
def lam(tmp_path: Path, d: Dispatcher) -> Iterator[LocalLambda]:
    with LocalLambda(tmp_path / "lambda") as lam:
        lam.add_function(
            "tp-probe",
            "lambda_probe.handler",
            env={"TASKPLAT_DISPATCHER_URL": d.base_url},
            pythonpath=[TESTS_DIR],
        )
        yield lam


def make_invoker(
    settings: RelaySettings, pool: ConnectionPool[Connection[DictRow]], d: Dispatcher
) -> Invoker:
    return Invoker(
        settings, pool=pool, client=lambda_client(settings), clock=d.clock, rand=random.Random(3)
    )


@pytest.fixture
def invoker(
    db_url: str, sqs_endpoint_url: str, relay_overrides: dict[str, object], lam: LocalLambda,
    pool: ConnectionPool[Connection[DictRow]], d: Dispatcher,
) -> Invoker:  # fmt: skip
    settings = make_settings(
        db_url, sqs_endpoint_url, lambda_endpoint_url=lam.url, **relay_overrides
    )
    return make_invoker(settings, pool, d)


def run(d: Dispatcher, job: str, **config: Any) -> str:
    response = d.api.post(f"/dags/d/jobs/{job}/runs", json={"config": config})
    assert response.status_code == 201, response.text
    task_id: str = response.json()["task_id"]
    return task_id


def outbox(db_url: str, task_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT kind, sent_at, skipped, send_attempts, last_error, available_at "
            "FROM outbox WHERE task_id = %s AND kind <> 'route_event' ORDER BY outbox_id",
            (task_id,),
        ).fetchall()


def task(d: Dispatcher, task_id: str) -> dict[str, Any]:
    response = d.api.get(f"/tasks/{task_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def finished(lam: LocalLambda, count: int, function: str = "tp-probe") -> list[Invocation]:
    def done() -> list[Invocation] | None:
        found = lam.invocations(function)
        ok = len(found) >= count and all(each.state in FINISHED for each in found)
        return found if ok else None

    return wait_for(done, timeout=60, what=f"{count} finished invocations of {function}")


def lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


def test_a_lambda_job_is_woken_by_an_invocation_not_a_message(
    d: Dispatcher, relay: Relay, db_url: str, queues: Queues
) -> None:
    queues.create("default")
    lambda_task, worker_task = run(d, "probe"), run(d, "worker")
    assert [row["kind"] for row in outbox(db_url, lambda_task)] == ["invoke_lambda"]
    assert [row["kind"] for row in outbox(db_url, worker_task)] == ["enqueue_task"]
    # The SQS batches never take an invocation: only the worker's wake-up leaves.
    relay.run_once()
    assert outbox(db_url, lambda_task)[0]["sent_at"] is None
    assert outbox(db_url, worker_task)[0]["sent_at"] is not None


def test_only_a_lambda_wakeup_notifies_the_invoker(d: Dispatcher, db_url: str) -> None:
    """Other queues' wake-ups never wake the invoker (migration 0014): notifications arrive in
    commit order, so the marker sent after the worker's run is the first one heard."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {INVOKE_CHANNEL}")
        run(d, "worker")
        listener.execute("SELECT pg_notify(%s, 'marker')", (INVOKE_CHANNEL,))
        run(d, "probe")
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    assert heard == ["marker", ""]


@pytest.mark.parametrize("relay_overrides", [{**LAMBDA_OVERRIDES, "interval_seconds": 30.0}])
def test_a_lambda_run_wakes_the_invoker_long_before_its_interval(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, rows: Rows
) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=invoker.run, args=(stop,), name="invoker", daemon=True)
    thread.start()
    try:
        # The loop ran its first (empty) batch and now listens, waiting up to 30 s.
        wait_for(lambda: invoker.health.batches >= 1, timeout=10, what="the first batch")
        wait_for(lambda: rows.listeners() >= 1, timeout=10, what="the invoker to LISTEN")
        task_id = run(d, "probe")
        wait_for(
            lambda: task(d, task_id)["status"] == "Completed",
            timeout=20,
            what="the notified run to be invoked and completed",
        )
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_an_invocation_runs_the_attempt_and_reports_it(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    dataset = next(x for x in d.api.get("/datasets").json()["datasets"] if x["name"] == "probed")
    task_id = run(d, "probe", marker=str(marker), events=[{"output_index": 0, "cursor": 7}])
    batch = invoker.run_once()
    assert (batch.invoked, batch.failed, batch.skipped) == (1, 0, 0)
    [invocation] = finished(lam, 1)
    assert invocation.state == "succeeded"
    assert invocation.response["status"] == "Accepted"
    # The payload is the claim: the task-fetch task, the lease and the attempt token.
    payload = invocation.payload
    assert payload["status"] == "Claimed" and payload["task"]["task_id"] == task_id
    assert payload["task"]["outputs"][0]["dataset_uuid"] == dataset["dataset_uuid"]
    ring = attempt_key_ring(TokenKeySettings(keys={"k1": SecretStr(KEYS["k1"])}, active_kid="k1"))
    scope = verify_attempt_token(ring, payload["attempt_token"], now=d.clock.now())
    assert (scope.task_id, scope.attempt) == (UUID(task_id), 1)
    # Deadline = the job's timeout, first lease = timeout + grace, from the claim.
    view = task(d, task_id)
    assert view["status"] == "Completed" and view["result"] == {"attempt": 1}
    [attempt] = view["attempts"]
    assert attempt["worker_id"] == "lambda:tp-probe" and attempt["outcome"] == "Completed"
    started = d.clock.now()
    assert payload["lease_expires_at"].startswith(started.strftime("%Y-%m-%dT%H:%M"))
    events = d.api.get(f"/tasks/{task_id}/events").json()["events"]
    assert [(e["cursor"], e["dataset_uuid"]) for e in events] == [(7, dataset["dataset_uuid"])]
    assert lines(marker) == [f"{task_id} 1"]
    [row] = outbox(db_url, task_id)
    assert row["sent_at"] is not None and not row["skipped"]


def test_an_operator_failure_is_a_failed_attempt(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda
) -> None:
    task_id = run(d, "probe", fail=True)
    invoker.run_once()
    [invocation] = finished(lam, 1)
    assert invocation.response["outcome"] == "Failed"
    view = task(d, task_id)
    assert view["status"] == "Failed" and view["next_retry_at"] is not None
    assert view["attempts"][0]["error"] == "asked to fail attempt 1"


def test_a_permanent_failure_is_dead_at_once(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda
) -> None:
    task_id = run(d, "probe", permanent=True)  # max_attempts 2: a plain failure is retried
    invoker.run_once()
    [invocation] = finished(lam, 1)
    assert invocation.response["outcome"] == "Failed"
    assert invocation.response["task_status"] == "Dead"
    view = task(d, task_id)
    assert view["status"] == "Dead" and view["next_retry_at"] is None
    assert (view["dead_reason"], view["last_error"]) == (
        "PermanentFailure",
        "never again (attempt 1)",
    )


def test_an_operator_near_the_function_limit_fails_cleanly(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda
) -> None:
    lam.add_function(
        "tp-slow",
        "lambda_probe.handler",
        env={"TASKPLAT_DISPATCHER_URL": d.base_url, "TASKPLAT_LAMBDA_MARGIN_SECONDS": "1.5"},
        pythonpath=[TESTS_DIR],
        timeout_seconds=4,
    )
    task_id = run(d, "slow", seconds=60)
    invoker.run_once()
    # The handler reports Failed before the limit, then resets its sandbox (no abandoned code
    # runs on): the endpoint sees the process end, never the limit.
    [invocation] = finished(lam, 1, "tp-slow")
    assert invocation.state == "crashed"
    view = task(d, task_id)
    assert view["attempts"][0]["outcome"] == "Failed"
    assert view["attempts"][0]["error"].startswith("timed out: the operator was still running")


def test_a_throttled_invocation_is_retried_with_backoff(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, db_url: str
) -> None:
    task_id = run(d, "probe")
    lam.refuse_next("tp-probe", 2)
    for expected_attempts in (1, 2):
        assert invoker.run_once().failed == 1
        [row] = outbox(db_url, task_id)
        assert row["sent_at"] is None and row["send_attempts"] == expected_attempts
        assert "TooManyRequestsException" in row["last_error"]
        assert row["available_at"] > d.clock.now()
        # The claim was rolled back with the failed Invoke: no attempt began.
        view = task(d, task_id)
        assert view["status"] == "Queued" and view["attempts"] == []
        assert invoker.run_once().invoked == 0  # not due before its backoff
        d.clock.advance(11)
    assert invoker.run_once().invoked == 1
    finished(lam, 1)
    assert task(d, task_id)["status"] == "Completed"
    assert len(lam.invocations()) == 1  # the refused calls were never accepted


def test_an_invocation_whose_claim_never_committed_runs_nothing(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, rows: Rows, tmp_path: Path,
    pool: ConnectionPool[Connection[DictRow]],
) -> None:  # fmt: skip
    """The relay dies after Lambda accepted the invocation and before its commit: the claim is
    rolled back, the function's first heartbeat (which waited on the claim's row lock) is
    refused, and the row, still pending, is performed again with a new lease."""
    marker = tmp_path / "marker"
    task_id = run(d, "probe", marker=str(marker))
    lam.on_invoke = lambda _request_id: rows.terminate("relay-test") and None
    with pytest.raises(psycopg.OperationalError):
        invoker.run_once()
    lam.on_invoke = None
    pool.check()  # the relay's other pooled connections were terminated too
    # Every invocation made under the uncommitted claim is refused (a CI run once saw two).
    orphans = finished(lam, 1)
    assert all(orphan.response["status"] == "Refused" for orphan in orphans)
    assert task(d, task_id)["status"] == "Queued"
    assert invoker.run_once().invoked == 1

    def accepted() -> list[Invocation] | None:
        found = [each for each in finished(lam, 1) if each.response["status"] == "Accepted"]
        return found or None

    [real] = wait_for(accepted, timeout=60, what="the re-invocation to be accepted")
    assert all(real.payload["lease_token"] != o.payload["lease_token"] for o in orphans)
    view = task(d, task_id)
    assert view["status"] == "Completed" and len(view["attempts"]) == 1
    assert lines(marker) == [f"{task_id} 1"]


def test_a_duplicate_delivery_of_an_attempt_changes_nothing(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = run(d, "probe", marker=str(marker))
    invoker.run_once()
    [first] = finished(lam, 1)
    before = task(d, task_id)
    assert before["status"] == "Completed"
    duplicate = lam.wait_state(lam.replay(first), *FINISHED)
    assert duplicate.response["status"] == "Refused"
    assert task(d, task_id) == before
    assert lines(marker) == [f"{task_id} 1"]


def test_a_stale_attempt_is_refused(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = run(d, "once", marker=str(marker), fail_attempts=[1], step=True)
    invoker.run_once()
    [first] = finished(lam, 1)
    assert task(d, task_id)["status"] == "Dead"
    assert d.api.post(f"/tasks/{task_id}/retry").status_code == 200
    assert invoker.run_once().invoked == 1  # the replay's wake-up is an invocation too
    finished(lam, 2)
    # Attempt 2 got attempt 1's step result with its claim, and did not run the step again.
    assert task(d, task_id)["result"] == {"attempt": 2, "first": 1}
    stale = lam.wait_state(lam.replay(first), *FINISHED)
    assert stale.response["status"] == "Refused"
    view = task(d, task_id)
    assert view["status"] == "Completed" and len(view["attempts"]) == 2
    assert lines(marker) == [f"{task_id} 2"]


def test_a_task_no_longer_queued_is_not_invoked(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, db_url: str
) -> None:
    task_id = run(d, "probe")
    assert d.api.put(f"/tasks/{task_id}/cancel").status_code == 200
    batch = invoker.run_once()
    assert (batch.invoked, batch.skipped) == (0, 1)
    [row] = outbox(db_url, task_id)
    assert row["skipped"] and row["sent_at"] is not None
    assert lam.invocations() == []


def test_without_signing_keys_nothing_is_claimed(
    d: Dispatcher, lam: LocalLambda, db_url: str, sqs_endpoint_url: str,
    pool: ConnectionPool[Connection[DictRow]],
) -> None:  # fmt: skip
    settings = make_settings(db_url, sqs_endpoint_url, lambda_endpoint_url=lam.url)
    task_id = run(d, "probe")
    assert make_invoker(settings, pool, d).run_once().failed == 1
    [row] = outbox(db_url, task_id)
    assert row["sent_at"] is None and row["last_error"] == NO_KEYS
    assert task(d, task_id)["status"] == "Queued" and lam.invocations() == []


def test_an_untrusted_job_is_invoked_with_its_capability_token_in_the_payload(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, db_url: str
) -> None:
    probed = next(x for x in d.api.get("/datasets").json()["datasets"] if x["name"] == "probed")
    pin = {"dataset_uuid": probed["dataset_uuid"], "cursor": 3,
           "dataset_version": probed["current_version"]}  # fmt: skip
    body = {"config": {"report_capability": True}, "inputs": [pin]}
    untrusted = d.api.post("/dags/d/jobs/sandboxed/runs", json=body).json()["task_id"]
    trusted = run(d, "probe", report_capability=True)
    assert invoker.run_once().invoked == 2
    invocations = {each.payload["task"]["task_id"]: each for each in finished(lam, 2)}
    payload = invocations[untrusted].payload
    assert payload["task"]["trust"] == "untrusted"
    ring = capability_key_ring(
        TokenKeySettings(keys={"c1": SecretStr(CAPABILITY_KEYS["c1"])}, active_kid="c1")
    )
    verified = verify_capability_token(ring, payload["capability_token"], now=d.clock.now())
    capability = verified.capability
    assert (str(capability.task_id), capability.attempt) == (untrusted, 1)
    assert [(str(i.dataset_uuid), str(i.dataset_version), i.cursor) for i in capability.inputs] == [
        (probed["dataset_uuid"], probed["current_version"], 3)
    ]
    # The operator got it from the payload (the function's environment holds none).
    assert task(d, untrusted)["result"] == {
        "attempt": 1, "capability_token": payload["capability_token"]}  # fmt: skip
    assert invocations[trusted].payload["capability_token"] is None
    assert task(d, trusted)["result"] == {"attempt": 1, "capability_token": None}


def test_without_capability_keys_an_untrusted_job_is_not_invoked(
    d: Dispatcher, lam: LocalLambda, db_url: str, sqs_endpoint_url: str,
    pool: ConnectionPool[Connection[DictRow]],
) -> None:  # fmt: skip
    settings = make_settings(
        db_url, sqs_endpoint_url, lambda_endpoint_url=lam.url,
        attempt_token_keys=KEYS, attempt_token_active_kid="k1",
    )  # fmt: skip
    task_id = d.api.post("/dags/d/jobs/sandboxed/runs", json={}).json()["task_id"]
    written = task_xmin(db_url, task_id)
    telemetry = Telemetry("outbox-relay")
    invoker = Invoker(
        settings, pool=pool, client=lambda_client(settings), clock=d.clock,
        rand=random.Random(3), telemetry=telemetry,
    )  # fmt: skip
    assert invoker.run_once().failed == 1
    [row] = outbox(db_url, task_id)
    assert row["sent_at"] is None and NO_CAPABILITY_KEYS in row["last_error"]
    assert "TASKPLAT_CAPABILITY_TOKEN_KEYS is not set" in row["last_error"]
    view = task(d, task_id)
    assert view["status"] == "Queued" and view["attempts"] == [] and lam.invocations() == []
    assert task_xmin(db_url, task_id) == written  # the claim took nothing: the row is as created
    assert 'taskplat_claims_refused_total{setting="TASKPLAT_CAPABILITY_TOKEN_KEYS"} 1.0' in (
        metric_lines(telemetry)
    )
    telemetry.shutdown()


def test_an_operator_listed_untrusted_is_not_invoked_without_capability_keys(
    d: Dispatcher, lam: LocalLambda, db_url: str, sqs_endpoint_url: str,
    pool: ConnectionPool[Connection[DictRow]], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The relay reads the dispatcher's list of untrusted operators: a job that does not say
    `trust` itself runs its listed operator untrusted on Lambda too (never without its token)."""
    monkeypatch.setenv("TASKPLAT_DISPATCHER_UNTRUSTED_OPERATORS", "slow, probe")
    settings = make_settings(
        db_url, sqs_endpoint_url, lambda_endpoint_url=lam.url,
        attempt_token_keys=KEYS, attempt_token_active_kid="k1",
    )  # fmt: skip
    assert settings.untrusted_operators == ["slow", "probe"]
    task_id = run(d, "once")
    written = task_xmin(db_url, task_id)
    invoker = make_invoker(settings, pool, d)
    assert invoker.run_once().failed == 1
    [row] = outbox(db_url, task_id)
    assert row["sent_at"] is None and NO_CAPABILITY_KEYS in row["last_error"]
    assert task(d, task_id)["status"] == "Queued" and lam.invocations() == []
    assert task_xmin(db_url, task_id) == written


def test_an_invocation_a_queue_limit_holds_back_keeps_its_row_for_later(
    d: Dispatcher, invoker: Invoker, lam: LocalLambda, db_url: str
) -> None:
    """The relay's claim for a function is held to the queue's limits like any other: the task
    it could not start stays Queued with no attempt, and its only wake-up (the invocation row)
    waits `retry_after_ms`, never marked skipped."""
    assert d.api.put("/queues/default", json={"concurrency_limit": 1}).status_code == 200
    first, second = run(d, "once"), run(d, "once")
    batch = invoker.run_once()
    assert batch.invoked == 1 and batch.skipped == 0
    held = second if task(d, first)["attempts"] else first
    [row] = outbox(db_url, held)
    assert row["sent_at"] is None and row["skipped"] is False
    assert row["send_attempts"] == 0 and row["available_at"] > d.clock.now()
    assert task(d, held)["status"] == "Queued" and task(d, held)["attempts"] == []
