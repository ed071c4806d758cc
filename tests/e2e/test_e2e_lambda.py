"""End to end, issue 14: a DAG mixing worker jobs and a Lambda job through the real stack
(dispatcher, relay with its Lambda invoker, scheduler, reaper, wrappers) and a function run by the
real `awslambdaric` client against the test-only Lambda endpoint. The same operator code runs in
the wrapper and in the function. The Lambda job's first attempt crashes its sandbox: the lease
expires, the reaper and the scheduler retry it, the relay invokes attempt 2, which completes; its
events start the downstream worker job, and its attempts and events show in `GET /tasks/{id}`
like any other task's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_stack import E2E_DIR, E2EStack, e2e_stack

from taskplat.devstack.lambda_endpoint import LocalLambda
from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e

DAG: dict[str, Any] = {
    "jobs": {
        "source": {
            "operator": "probe",
            "config": {"events": [{"output_index": 0, "cursor": 5}]},
            "outputs": [{"index": 0, "dataset": "raw"}],
        },
        "enrich": {
            "operator": "probe",
            "runtime": "lambda",
            "timeout_seconds": 20,
            "max_attempts": 3,
            "backoff_base_seconds": 0.2,
            "backoff_max_seconds": 0.5,
            "config": {"forward": True, "crash_attempts": [1]},
            "inputs": [{"from": {"job": "source", "output_index": 0}}],
            "outputs": [{"index": 0, "dataset": "enriched"}],
        },
        "report": {"operator": "echo", "inputs": [{"from": {"job": "enrich", "output_index": 0}}]},
    }
}


@pytest.fixture(scope="module")
def lam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLambda]:
    with LocalLambda(tmp_path_factory.mktemp("lambda")) as lam:
        yield lam


@pytest.fixture(scope="module")
def stack(
    database_url: str,
    sqs_endpoint_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    lam: LocalLambda,
) -> Iterator[E2EStack]:
    with e2e_stack(
        "lambda",
        tmp_path_factory.mktemp("stack-lambda"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=1,
        env={
            "TASKPLAT_RELAY_LAMBDA_ENDPOINT_URL": lam.url,
            "TASKPLAT_RELAY_LAMBDA_GRACE_SECONDS": "1",
        },
    ) as running:
        # The function holds the dispatcher's URL only: no worker token, no database.
        lam.add_function(
            "probe",
            "e2e_lambda_operator.handler",
            env={"TASKPLAT_DISPATCHER_URL": str(running.api.base_url).rstrip("/")},
            pythonpath=[E2E_DIR],
            timeout_seconds=20,
        )
        yield running


def job_tasks(stack: E2EStack, job: str) -> list[dict[str, Any]]:
    response = stack.api.get("/tasks", params={"dag": "mixed", "job": job})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def test_a_dag_mixing_worker_and_lambda_jobs_runs_end_to_end(
    stack: E2EStack, lam: LocalLambda
) -> None:
    assert stack.api.put("/dags/mixed", json=DAG).status_code == 201
    source = stack.api.post("/dags/mixed/jobs/source/runs", json={}).json()
    assert stack.wait_status(source["task_id"], "Completed")["attempts"][0]["worker_id"] != (
        "lambda:probe"
    )
    [enrich] = wait_for(
        lambda: job_tasks(stack, "enrich"), timeout=30, what="the Lambda job's task"
    )
    done = stack.wait_status(enrich["task_id"], "Completed", "Dead", timeout=60)
    assert done["status"] == "Completed", done
    first, second = done["attempts"]
    assert (first["attempt"], first["worker_id"], first["outcome"]) == (
        1, "lambda:probe", "LeaseExpired",
    )  # fmt: skip
    assert (second["attempt"], second["worker_id"], second["outcome"]) == (
        2, "lambda:probe", "Completed",
    )  # fmt: skip
    assert done["result"] == {"attempt": 2, "emitted": [{"output_index": 0, "cursor": 5}]}
    events = stack.api.get(f"/tasks/{enrich['task_id']}/events").json()["events"]
    assert [(event["cursor"], event["producer"]["attempt"]) for event in events] == [(5, 2)]
    # Two invocations, one per attempt: the crashed sandbox's, and the retry's.
    invocations = lam.invocations("probe")
    assert [each.state for each in invocations] == ["crashed", "succeeded"]
    assert [each.payload["attempt"] for each in invocations] == [1, 2]
    # The Lambda job's event started the downstream worker job.
    [report] = wait_for(lambda: job_tasks(stack, "report"), timeout=30, what="the report task")
    assert stack.wait_status(report["task_id"], "Completed")["inputs"][0]["cursor"] == 5
