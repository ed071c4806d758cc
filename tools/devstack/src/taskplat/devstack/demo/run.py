"""`make demo`: start a private stack, submit echo tasks over HTTP, wait, summarize; then apply a
three-job DAG, trigger it and show its routing (`pipeline`); then, when the TypeScript and
Rust runtimes are built, the same kind of DAG with one operator per language, on the wrapper and
as Lambda functions (`polyglot`); stop.

Invariants:
- The demo runs its own stack in its own directory on free ports, with a fresh database, so it
  never collides with `make up` and counts only its own tasks; the stack is stopped however the
  demo ends (Ctrl-C included).
- Every task is submitted with an idempotency key, so a submission retried after a network error
  never creates a second task.
- Waiting has a deadline; the exit code is 0 only when every submitted task is Completed.
- Progress is read from the stack's own database (one read-only count per poll), so it never
  depends on the format of `/metrics`; tasks are submitted and listed over HTTP only.
- Enqueue-to-start latency is measured from the task's `created_at` to its first attempt's
  `started_at`, both taken from the database clock.
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from tqdm import tqdm

from taskplat.common.db.queries import load_queries
from taskplat.devstack.demo.pipeline import run_pipeline_demo
from taskplat.devstack.demo.polyglot import (
    PolyglotOperators,
    add_functions,
    find_operators,
    run_polyglot_demo,
    write_operators_file,
)
from taskplat.devstack.demo.query import operators_file, run_query_demo
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.lambda_endpoint import LocalLambda
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.stack.services import WORKER_GROUP

SUBMIT_THREADS = 8
SUBMIT_RETRIES = 3
POLL_SECONDS = 0.25
PAGE = 500
QUERIES = load_queries("taskplat.devstack.demo", "demo.sql")


@dataclass(frozen=True)
class Summary:
    submitted: int
    statuses: Counter[str]
    elapsed_seconds: float
    tasks_per_second: float
    latencies: list[float]

    @property
    def completed(self) -> int:
        return self.statuses.get("Completed", 0)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _submit_one(client: httpx.Client, run_id: str, n: int) -> str:
    body = {"operator": "echo", "config": {"n": n}, "idempotency_key": f"demo-{run_id}-{n}"}
    for attempt in range(SUBMIT_RETRIES):
        try:
            response = client.post("/tasks", json=body)
        except httpx.TransportError:
            if attempt + 1 == SUBMIT_RETRIES:
                raise
            continue
        if response.status_code in (200, 201):
            task_id: str = response.json()["task_id"]
            return task_id
        if response.status_code < 500 or attempt + 1 == SUBMIT_RETRIES:
            raise DevstackError(f"POST /tasks answered {response.status_code}: {response.text}")
    raise AssertionError("unreachable")


def submit(client: httpx.Client, count: int) -> list[str]:
    run_id = uuid.uuid4().hex[:12]
    task_ids: list[str] = []
    with (
        ThreadPoolExecutor(SUBMIT_THREADS) as pool,
        tqdm(total=count, desc="submitted", unit="task", position=0) as bar,
    ):
        futures = [pool.submit(_submit_one, client, run_id, n) for n in range(count)]
        for future in as_completed(futures):
            task_ids.append(future.result())
            bar.update(1)
    return task_ids


def wait_terminal(
    database_url: str, count: int, timeout: float, submitting: Future[list[str]]
) -> bool:
    """Show completion while the tasks are submitted and run; False at the deadline or when the
    submission failed."""
    deadline = time.monotonic() + timeout
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        tqdm(total=count, desc="finished ", unit="task", position=1) as bar,
    ):
        while True:
            if submitting.done() and submitting.exception() is not None:
                return False
            finished, _ = conn.execute(QUERIES["progress"]).fetchone() or (0, 0)
            bar.update(max(0, min(finished, count) - bar.n))
            if finished >= count:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)


def fetch_all(client: httpx.Client) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": PAGE}
        if cursor:
            params["cursor"] = cursor
        response = client.get("/tasks", params=params)
        response.raise_for_status()
        page = response.json()
        tasks.extend(page["tasks"])
        cursor = page["next_cursor"]
        if not cursor:
            return tasks


def summarize(tasks: list[dict[str, Any]], submitted: int) -> Summary:
    statuses = Counter(str(task["status"]) for task in tasks)
    latencies = sorted(
        (
            _timestamp(task["attempts"][0]["started_at"]) - _timestamp(task["created_at"])
        ).total_seconds()
        for task in tasks
        if task["attempts"]
    )
    created = [_timestamp(task["created_at"]) for task in tasks]
    finished = [_timestamp(task["finished_at"]) for task in tasks if task["finished_at"]]
    elapsed = (max(finished) - min(created)).total_seconds() if finished and created else 0.0
    completed = statuses.get("Completed", 0)
    rate = completed / elapsed if elapsed > 0 else 0.0
    return Summary(submitted, statuses, elapsed, rate, latencies)


def report(summary: Summary) -> str:
    others = ", ".join(
        f"{status} {count}"
        for status, count in sorted(summary.statuses.items())
        if status != "Completed"
    )
    lat = summary.latencies
    if lat:
        latency = ", ".join(f"p{p} {percentile(lat, p) * 1000:.0f} ms" for p in (50, 95, 99))
        latency += f", max {lat[-1] * 1000:.0f} ms"
    else:
        latency = "no attempts"
    missing = summary.submitted - summary.completed
    lines = [
        f"submitted      {summary.submitted}",
        f"completed      {summary.completed}",
        f"not completed  {missing}" + (f" ({others})" if others else ""),
        f"throughput     {summary.tasks_per_second:.1f} tasks/s "
        f"(first created to last finished: {summary.elapsed_seconds:.2f}s)",
        f"enqueue-to-start latency: {latency}",
    ]
    return "\n".join(lines)


def run_demo(run_dir: Path, *, tasks: int, workers: int, timeout: float) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as extras:
        operators = operators_file(run_dir)
        polyglot = find_operators()
        lam: LocalLambda | None = None
        env: dict[str, str] = {}
        if isinstance(polyglot, PolyglotOperators):
            lam = extras.enter_context(LocalLambda(run_dir / "lambda"))
            write_operators_file(operators, polyglot)
            env = {"TASKPLAT_RELAY_LAMBDA_ENDPOINT_URL": lam.url}
        return _run_demo(run_dir, tasks, workers, timeout, env, operators, lam, polyglot)


def _run_demo(
    run_dir: Path,
    tasks: int,
    workers: int,
    timeout: float,
    env: dict[str, str],
    operators: Path,
    lam: LocalLambda | None,
    polyglot: PolyglotOperators | str,
) -> int:
    config = StackConfig(
        run_dir=run_dir,
        workers=workers,
        dispatcher_port=None,
        keep_data=False,
        data_services=True,  # the untrusted join reads through the query service
        env=env,
        service_env={WORKER_GROUP: {"TASKPLAT_WORKER_OPERATORS_FILE": str(operators)}},
    )
    stack = Stack(config)
    print(f"starting a private stack in {run_dir} ...", file=sys.stderr, flush=True)
    try:
        info = stack.start()
        print(
            f"stack ready at {info.dispatcher_url}; service logs in {stack.log_dir}",
            file=sys.stderr,
            flush=True,
        )
        headers = {"Authorization": f"Bearer {info.api_key}"}
        limits = httpx.Limits(max_connections=SUBMIT_THREADS * 2)
        with httpx.Client(
            base_url=info.dispatcher_url, headers=headers, timeout=30.0, limits=limits
        ) as client:
            with ThreadPoolExecutor(1) as runner:
                submitting = runner.submit(submit, client, tasks)
                finished = wait_terminal(info.database_url, tasks, timeout, submitting)
                submitted = submitting.result()
            summary = summarize(fetch_all(client), len(submitted))
            print(report(summary), flush=True)
            if not finished:
                print(f"demo: not every task finished within {timeout:.0f}s", file=sys.stderr)
            pipeline_ok, pipeline_report = run_pipeline_demo(client, timeout=timeout)
            print(pipeline_report, flush=True)
            if lam is not None and isinstance(polyglot, PolyglotOperators):
                add_functions(lam, polyglot, info.dispatcher_url)
                for runtime in ("ecs", "lambda"):
                    ran, polyglot_report = run_polyglot_demo(client, runtime, timeout=timeout)
                    print(polyglot_report, flush=True)
                    pipeline_ok = pipeline_ok and ran
            else:
                print(f"polyglot pipeline skipped: {polyglot}", flush=True)
            query_ok, query_report = run_query_demo(client, timeout=timeout)
            print(query_report, flush=True)
        return 0 if summary.completed == len(submitted) and pipeline_ok and query_ok else 1
    finally:
        print("stopping the stack ...", file=sys.stderr, flush=True)
        stack.stop()
