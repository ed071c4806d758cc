"""End to end: a DAG whose three jobs are operators in three languages (TypeScript emits, Rust
transforms, Python reports), run through the real stack once on the worker wrapper and once as
Lambda functions (the test-only Lambda endpoint's Runtime API: the Node runtime stand-in, the Rust
`bootstrap`, and `awslambdaric`). Each event reaches the next job exactly once: three events of
the first job make exactly three transform tasks, whose three events make exactly three reports.

The operators are the runtimes' example operators (the shared contract tests run the same code).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_stack import E2EStack, e2e_stack

from taskplat.devstack.lambda_endpoint import LocalLambda, node_runtime_command
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.runtime_builds import (
    BUILD_TIMEOUT,
    PY_OPERATOR,
    PY_OPERATOR_DIR,
    JsRuntime,
    RustRuntime,
    build_js,
    build_rust,
)

# The module fixture builds the runtimes (a first Rust build is slow on a small machine).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(BUILD_TIMEOUT),
    pytest.mark.prebuild("rust-runtime", "js-runtime"),
]

CURSORS = [11, 12, 13]


def dag(runtime: str, prefix: str) -> dict[str, Any]:
    """`runtime`: ecs (worker wrapper) or lambda; `prefix` keeps the two DAGs' datasets apart."""
    timeouts = {"timeout_seconds": 30} if runtime == "lambda" else {}
    return {
        "jobs": {
            "emit": {
                "operator": "rt-js",
                "runtime": runtime,
                **timeouts,
                "config": {"events": [{"output_index": 0, "cursor": c} for c in CURSORS]},
                "outputs": [{"index": 0, "dataset": f"{prefix}-raw"}],
            },
            "transform": {
                "operator": "rt-rs",
                "runtime": runtime,
                **timeouts,
                "config": {"forward": True},
                "inputs": [{"from": {"job": "emit", "output_index": 0}}],
                "outputs": [{"index": 0, "dataset": f"{prefix}-enriched"}],
            },
            "report": {
                "operator": "rt-py",
                "runtime": runtime,
                **timeouts,
                "inputs": [{"from": {"job": "transform", "output_index": 0}}],
            },
        }
    }


@pytest.fixture(scope="module")
def runtimes() -> tuple[JsRuntime, RustRuntime]:
    return build_js(), build_rust()


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
    runtimes: tuple[JsRuntime, RustRuntime],
) -> Iterator[E2EStack]:
    js, rust = runtimes
    operators = tmp_path_factory.mktemp("operators") / "operators.yaml"
    operators.write_text(
        "operators:\n"
        f'  rt-js: {{command: ["{js.node}", "{js.operator}"], mode: per-task}}\n'
        f'  rt-rs: {{command: ["{rust.bootstrap}"], mode: pooled, pool_size: 1}}\n'
        f'  rt-py: {{command: ["{{python}}", "{PY_OPERATOR}"],'
        " mode: per-task}\n"
    )
    with e2e_stack(
        "runtimes",
        tmp_path_factory.mktemp("stack-runtimes"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=1,
        env={
            "TASKPLAT_WORKER_OPERATORS_FILE": str(operators),
            "TASKPLAT_RELAY_LAMBDA_ENDPOINT_URL": lam.url,
            "TASKPLAT_RELAY_LAMBDA_GRACE_SECONDS": "1",
        },
    ) as running:
        env = {"TASKPLAT_DISPATCHER_URL": str(running.api.base_url).rstrip("/")}
        lam.add_function(
            "rt-js", "operator.handler", env=env, command=node_runtime_command(js.operator)
        )
        lam.add_function("rt-rs", "bootstrap", env=env, command=[str(rust.bootstrap)])
        lam.add_function("rt-py", "example_operator.handler", env=env, pythonpath=[PY_OPERATOR_DIR])
        yield running


def job_tasks(stack: E2EStack, dag_name: str, job: str) -> list[dict[str, Any]]:
    response = stack.api.get("/tasks", params={"dag": dag_name, "job": job})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def finished(stack: E2EStack, dag_name: str, job: str, count: int) -> list[dict[str, Any]]:
    def all_done() -> list[dict[str, Any]] | None:
        tasks = job_tasks(stack, dag_name, job)
        terminal = [t for t in tasks if t["status"] in ("Completed", "Dead", "Canceled")]
        return tasks if len(tasks) >= count and len(terminal) == len(tasks) else None

    tasks = wait_for(all_done, timeout=60, what=f"{count} finished {job} tasks of {dag_name}")
    assert tasks is not None
    return tasks


@pytest.mark.parametrize("runtime", ["ecs", "lambda"])
def test_three_languages_in_one_dag(stack: E2EStack, lam: LocalLambda, runtime: str) -> None:
    name = f"polyglot-{runtime}"
    assert stack.api.put(f"/dags/{name}", json=dag(runtime, name)).status_code == 201
    emit = stack.api.post(f"/dags/{name}/jobs/emit/runs", json={}).json()
    done = stack.wait_status(emit["task_id"], "Completed", "Dead", timeout=60)
    assert done["status"] == "Completed", done
    assert done["result"] == {"attempt": 1, "emitted": 3, "inputs": []}

    transforms = finished(stack, name, "transform", len(CURSORS))
    reports = finished(stack, name, "report", len(CURSORS))
    for tasks in (transforms, reports):
        assert [t["status"] for t in tasks] == ["Completed"] * len(CURSORS), tasks
        assert sorted(t["result"]["inputs"][0] for t in tasks) == CURSORS
        assert all(len(t["inputs"]) == 1 and t["result"]["attempt"] == 1 for t in tasks)
    assert sorted(t["result"]["emitted"] for t in transforms) == [1, 1, 1]

    # Exactly once: each event of each dataset created exactly one task of the next job.
    for dataset in (f"{name}-raw", f"{name}-enriched"):
        [found] = [d for d in stack.api.get("/datasets").json()["datasets"] if d["name"] == dataset]
        events = stack.api.get(f"/datasets/{found['dataset_uuid']}/events").json()["events"]
        assert sorted(e["cursor"] for e in events) == CURSORS
        assert all(e["routed"] and len(e["tasks"]) == 1 for e in events), events
    # No more tasks appear after the routing settled.
    assert len(job_tasks(stack, name, "transform")) == len(job_tasks(stack, name, "report")) == 3

    workers = {
        t["attempts"][0]["worker_id"]
        for job in ("emit", "transform", "report")
        for t in job_tasks(stack, name, job)
        for t in [stack.get(t["task_id"])]
    }
    if runtime == "lambda":
        assert workers == {"lambda:rt-js", "lambda:rt-rs", "lambda:rt-py"}
        states = [
            i.state for i in lam.invocations() if i.payload["task"]["job"]["dag_name"] == name
        ]
        assert states == ["succeeded"] * 7, states
    else:
        assert not any(worker.startswith("lambda:") for worker in workers)
