"""The polyglot part of `make demo`: one DAG whose jobs are operators in three languages
(TypeScript emits, Rust transforms, Python reports: the example operators of the three runtimes
under libs/), run once on the worker wrapper and once as Lambda functions (the test-only Lambda
endpoint, `LocalLambda`), with the routing shown for each.

Invariants:
- It runs only when the TypeScript and Rust runtimes are built (`make runtimes`: node, the
  package's dist/ and the Rust `bootstrap`); otherwise `find_operators` says why and the demo
  skips this part.
- The demo's worker gets an operators file with the default operators plus `rt-js`, `rt-rs` and
  `rt-py` (absolute commands: an operator's environment has no PATH).
- Everything else goes through the public HTTP API; a wait has a deadline; the result is True only
  when each job has exactly one task per upstream event, all Completed.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from taskplat.devstack.lambda_endpoint import LocalLambda, node_runtime_command

REPO = Path(__file__).resolve().parents[6]
CURSORS = (7, 8, 9)
JOBS = ("emit", "transform", "report")
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class PolyglotOperators:
    node: str
    js_operator: Path
    rust_bootstrap: Path
    py_operator: Path


def find_operators(repo: Path = REPO) -> PolyglotOperators | str:
    """The three example operators, or why they cannot run (a one-line reason)."""
    node = shutil.which("node")
    js = repo / "libs" / "lambda-runtime-js"
    rust = repo / "libs" / "lambda-runtime-rs" / "target" / "debug" / "bootstrap"
    if node is None:
        return "node is not installed"
    if not (js / "dist" / "esm" / "index.js").exists():
        return "the TypeScript runtime is not built (make runtimes)"
    if not rust.exists():
        return "the Rust runtime is not built (make runtimes)"
    py = repo / "libs" / "lambda-runtime" / "examples" / "example_operator.py"
    return PolyglotOperators(node, js / "examples" / "operator.mjs", rust, py)


def write_operators_file(path: Path, operators: PolyglotOperators) -> Path:
    """The operators of `path` (when it exists, else the wrapper's defaults) plus the three
    example operators."""
    spec = importlib.util.find_spec("taskplat.worker_wrapper")
    assert spec is not None and spec.origin is not None, "the worker wrapper is not installed"
    base = path if path.exists() else Path(spec.origin).with_name("operators.yaml")
    document = yaml.safe_load(base.read_text(encoding="utf-8"))
    document["operators"].update(
        {
            "rt-js": {"command": [operators.node, str(operators.js_operator)], "mode": "per-task"},
            "rt-rs": {"command": [str(operators.rust_bootstrap)], "mode": "pooled", "pool_size": 1},
            "rt-py": {"command": ["{python}", str(operators.py_operator)], "mode": "per-task"},
        }
    )
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def add_functions(lam: LocalLambda, operators: PolyglotOperators, dispatcher_url: str) -> None:
    env = {"TASKPLAT_DISPATCHER_URL": dispatcher_url.rstrip("/")}
    lam.add_function(
        "rt-js", "operator.handler", env=env, command=node_runtime_command(operators.js_operator)
    )
    lam.add_function("rt-rs", "bootstrap", env=env, command=[str(operators.rust_bootstrap)])
    lam.add_function(
        "rt-py", "example_operator.handler", env=env, pythonpath=[operators.py_operator.parent]
    )


def pipeline(runtime: str, name: str) -> dict[str, Any]:
    extra: dict[str, Any] = {"runtime": runtime}
    if runtime == "lambda":
        extra["timeout_seconds"] = 60
    return {
        "jobs": {
            "emit": {
                "operator": "rt-js",
                **extra,
                "config": {"events": [{"output_index": 0, "cursor": c} for c in CURSORS]},
                "outputs": [{"index": 0, "dataset": f"{name}_raw"}],
            },
            "transform": {
                "operator": "rt-rs",
                **extra,
                "config": {"forward": True},
                "inputs": [{"from": {"job": "emit", "output_index": 0}}],
                "outputs": [{"index": 0, "dataset": f"{name}_enriched"}],
            },
            "report": {
                "operator": "rt-py",
                **extra,
                "inputs": [{"from": {"job": "transform", "output_index": 0}}],
            },
        }
    }


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url.path} answered "
                           f"{response.status_code}: {response.text}")  # fmt: skip
    return response.json()


def _tasks(client: httpx.Client, name: str, job: str) -> list[dict[str, Any]]:
    page = _ok(client.get("/tasks", params={"dag": name, "job": job, "limit": 100}))
    tasks: list[dict[str, Any]] = page["tasks"]
    return tasks


def _done(client: httpx.Client, name: str) -> bool:
    expected = {"emit": 1, "transform": len(CURSORS), "report": len(CURSORS)}
    for job, count in expected.items():
        tasks = _tasks(client, name, job)
        if len(tasks) < count or any(task["status"] != "Completed" for task in tasks):
            return False
    return True


def run_polyglot_demo(client: httpx.Client, runtime: str, *, timeout: float) -> tuple[bool, str]:
    """Apply the three-language DAG for `runtime` (ecs or lambda), trigger it, wait; (every job
    ran as expected, the report)."""
    name = f"polyglot_{runtime}"
    _ok(client.put(f"/dags/{name}", json=pipeline(runtime, name)))
    _ok(client.post(f"/dags/{name}/jobs/emit/runs", json={}))
    deadline = time.monotonic() + timeout
    while not _done(client, name) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    where = "as Lambda functions" if runtime == "lambda" else "on the worker wrapper"
    lines = [f"pipeline '{name}' {where}: emit (TypeScript) -> transform (Rust) -> report (Python)"]
    ok = True
    for job, expected in zip(JOBS, (1, len(CURSORS), len(CURSORS)), strict=True):
        tasks = _tasks(client, name, job)
        statuses = sorted({task["status"] for task in tasks})
        positions = sorted(i.get("cursor") for task in tasks for i in task["inputs"])
        lines.append(f"  job {job:<10} {len(tasks)} task(s) {'/'.join(statuses) or '-'}"
                     + (f", inputs at cursors {positions}" if positions else ""))  # fmt: skip
        ok = ok and len(tasks) == expected and statuses == ["Completed"]
    for dataset in _ok(client.get("/datasets"))["datasets"]:
        if not dataset["name"].startswith(f"{name}_"):
            continue
        events = _ok(client.get(f"/datasets/{dataset['dataset_uuid']}/events"))["events"]
        created = [len(event["tasks"]) for event in events]
        lines.append(f"  dataset {dataset['name']:<26} {len(events)} event(s), "
                     f"{sum(created)} downstream task(s) started")  # fmt: skip
        ok = ok and created == [1] * len(CURSORS)
    lines.append("every event reached the next job exactly once" if ok
                 else "the pipeline did not finish as expected before the deadline")  # fmt: skip
    return ok, "\n".join(lines)
