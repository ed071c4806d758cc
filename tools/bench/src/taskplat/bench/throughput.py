"""W1 (throughput), W2 (latency) and W4 (throughput over a grown database): submit tasks over
HTTP, wait until every one is finished, and compute one run's figures.

Invariants:
- A fresh stack is warmed up before its first measured run (`warm_up`: 500 no-op tasks, then
  ANALYZE), so no run pays for cold connections, operator processes or plans made on an empty
  database.
- A run starts only when the stack is idle (no unfinished task, no message in the SQS task
  queue, every wrapper healthy), so it measures its own tasks only; the wait is recorded
  (`idle_wait_seconds`).
- Times compared with each other come from one clock, the machine's `time.time()`: the client's
  reading just before a request, the operators' `started`/`finished` in their results.
- The run's SQS requests are counted from the run's start until the task queue is empty again
  after the last task finished (the wake-ups its tasks left behind are part of its cost) and
  the SQS server's log went quiet: from the services' `taskplat_sqs_requests_total` counters
  when every SQS client exports them, and from the server's request log (always recorded).
  The CPU split by process (W1, W4 and W2) is taken from just before the first request until
  every task of the run has finished.
- With `blocks` (`--postgres-blocks`), Postgres's shared-buffer block hits and reads by table
  and index are the difference of two snapshots, each taken `BLOCK_REPORT_SECONDS` after the
  backends went quiet (a backend reports its counts at most once a second while busy, and 10 s
  after it went idle), so they include the background of the idle stack over ~2x11 s.
- A run whose tasks do not all finish by the deadline raises `BenchError`; "exactly once" is a
  figure (False is reported, not raised), checked on the database for every task of the run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
from tqdm import tqdm

from taskplat.bench.client import BenchError, Submitted, submit_paced, submit_tasks
from taskplat.bench.config import Sizes
from taskplat.bench.harness import BenchStack
from taskplat.bench.probes import counter_deltas, cpu_split
from taskplat.bench.stats import percentile

Submitter = Callable[[Callable[[int], None], threading.Event], Coroutine[Any, Any, Submitted]]
POLL_SECONDS = 0.2
REQUESTS_COUNTER = "taskplat_sqs_requests_total"
WARM_UP_TASKS = 500


def find_batch_path(bs: BenchStack) -> str | None:
    """The dispatcher's bulk create route (a POST path under /tasks naming a batch), if any."""
    try:
        response = httpx.get(f"{bs.dispatcher_url}/openapi.json", timeout=10.0)
        paths = response.json().get("paths", {}) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    for path, operations in paths.items():
        if (
            path.startswith("/tasks")
            and "{" not in path
            and any(word in path for word in ("batch", "bulk"))
            and "post" in operations
        ):
            return str(path)
    return None


def submit_and_drain(bs: BenchStack, n: int, submit: Submitter, label: str) -> Submitted:
    """Run `submit` (on its own event loop thread) and show progress until every task it
    created is finished; on any error (Ctrl-C too) no new request starts."""
    since = time.time() - 0.5
    timeout = max(120.0, n / 10)
    done = [0]
    stop = threading.Event()

    def on_done(count: int) -> None:
        done[0] += count

    with (
        ThreadPoolExecutor(1, thread_name_prefix="bench-submit") as runner,
        tqdm(total=n, desc=f"{label} submitted", unit="task", leave=False, disable=None) as sent,
        tqdm(total=n, desc=f"{label} finished ", unit="task", leave=False, disable=None) as fin,
    ):
        future: Future[Submitted] = runner.submit(asyncio.run, submit(on_done, stop))
        try:
            deadline: float | None = None
            while True:
                sent.update(done[0] - sent.n)
                finished = bs.one("finished_since", since=since)["n"]
                fin.update(min(finished, n) - fin.n)
                if future.done():
                    submitted = future.result()  # raises what the submission raised
                    sent.update(n - sent.n)
                    deadline = deadline or time.monotonic() + timeout
                    ids = submitted.task_ids
                    if finished >= n and bs.one("finished_count", ids=ids)["n"] >= n:
                        fin.update(n - fin.n)
                        return submitted
                if deadline is not None and time.monotonic() > deadline:
                    raise BenchError(f"{label}: {n - finished} task(s) not finished in {timeout}s")
                time.sleep(POLL_SECONDS)
        finally:
            stop.set()


def _exactly_once(bs: BenchStack, ids: list[str]) -> tuple[bool, dict[str, int]]:
    counts = bs.one("exactly_once", ids=ids)
    n = len(ids)
    ok = all(counts[key] == n for key in counts)
    return ok, {key: int(value) for key, value in counts.items()}


def _submit_noops(
    bs: BenchStack, sizes: Sizes, batch_path: str | None, n: int, label: str
) -> Submitted:
    bodies = [{"operator": "noop"} for _ in range(n)]

    def submit(
        on_done: Callable[[int], None], stop: threading.Event
    ) -> Coroutine[Any, Any, Submitted]:
        return submit_tasks(
            bs.dispatcher_url,
            bs.headers,
            bodies,
            in_flight=sizes.in_flight,
            batch_path=batch_path,
            batch_size=sizes.batch_size,
            on_done=on_done,
            stop=stop,
        )

    return submit_and_drain(bs, n, submit, label)


def warm_up(bs: BenchStack, sizes: Sizes, batch_path: str | None, label: str) -> dict[str, Any]:
    """Before the first measured run of a fresh stack: a few hundred no-op tasks (connections,
    pooled operators and caches get going), the queue emptied, then ANALYZE."""
    n = min(sizes.w1_tasks, WARM_UP_TASKS)
    started = time.monotonic()
    bs.wait_idle()
    _submit_noops(bs, sizes, batch_path, n, label)
    bs.wait_queue_empty()
    bs.query_exec("analyze")
    return {"tasks": n, "seconds": round(time.monotonic() - started, 1)}


BLOCK_REPORT_SECONDS = 11.0
# Relations named in a run's figures: those with the most block accesses per task.
BLOCK_RELATIONS = 10


def block_io(bs: BenchStack) -> dict[str, tuple[int, int]]:
    """Postgres's cumulative (hit, read) shared-buffer blocks by table and index, once every
    backend reported its counts."""
    time.sleep(BLOCK_REPORT_SECONDS)
    return {row["relation"]: (int(row["hit"]), int(row["read"])) for row in bs.query("block_io")}


def blocks_per_task(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], tasks: int
) -> dict[str, Any]:
    """Block hits and reads per task over a run: in all, and for the busiest relations."""
    deltas = {
        name: (hit - before.get(name, (0, 0))[0], read - before.get(name, (0, 0))[1])
        for name, (hit, read) in after.items()
    }
    busiest = sorted(deltas.items(), key=lambda item: -(item[1][0] + item[1][1]))
    return {
        "hit": round(sum(hit for hit, _ in deltas.values()) / tasks, 2),
        "read": round(sum(read for _, read in deltas.values()) / tasks, 2),
        "by_relation": {
            name: {"hit": round(hit / tasks, 2), "read": round(read / tasks, 2)}
            for name, (hit, read) in busiest[:BLOCK_RELATIONS]
        },
    }


def measure_throughput(
    bs: BenchStack, sizes: Sizes, batch_path: str | None, label: str, *, blocks: bool = False
) -> dict[str, Any]:
    """One run of W1 (or W4): `sizes.w1_tasks` no-op tasks as fast as the client can."""
    n = sizes.w1_tasks
    idle_wait = bs.wait_idle()
    blocks_before = block_io(bs) if blocks else {}
    assert bs.sqs_log is not None
    counters_before = bs.sqs_counters()
    calls_before = bs.dispatcher_calls()
    bs.sqs_log.mark()
    cpu_before = bs.cpu_snapshot()
    submitted = _submit_noops(bs, sizes, batch_path, n, label)
    cpu_after = bs.cpu_snapshot()
    times = bs.one("operator_times", ids=submitted.task_ids)
    # The run's SQS cost includes consuming the wake-ups its tasks left behind (a task claimed
    # ahead of its message, a republished one): count until the queue is empty again.
    cleanup = bs.wait_queue_empty()
    bs.settle_sqs()
    requests = bs.sqs_log.count()
    after = bs.sqs_counters()
    counters = counter_deltas(counters_before, after)
    calls_after = bs.dispatcher_calls()
    calls = {
        route: count - calls_before.get(route, 0.0)
        for route, count in sorted(calls_after.items())
        if "/internal/" in route and count > calls_before.get(route, 0.0)
    }
    once, counts = _exactly_once(bs, submitted.task_ids)
    republished = max(0, int(bs.one("wakeups", ids=submitted.task_ids)["n"]) - n)
    if times["last_finished"] is None:
        raise BenchError(f"{label}: no operator timestamps in the results")
    submit_seconds = submitted.last_answered - submitted.first_sent
    drain_seconds = float(times["last_finished"]) - submitted.first_sent
    logged = sum(requests.values())
    # The services' own request counters when every SQS client (the relay and each wrapper)
    # exports them, else the SQS server's log; both are kept.
    exporters = [
        any(key.startswith(REQUESTS_COUNTER) for key in samples) for samples in after.values()
    ]
    counted = [
        value
        for samples in counters.values()
        for key, value in samples.items()
        if key.startswith(REQUESTS_COUNTER)
    ]
    use_counters = bool(exporters) and all(exporters)
    total = sum(counted) if use_counters else logged
    wall = cpu_after.wall - cpu_before.wall
    figures: dict[str, Any] = {
        "tasks": n,
        "submit_rate": round(n / submit_seconds, 1),
        "drain_rate": round(n / drain_seconds, 1),
        "submit_seconds": round(submit_seconds, 3),
        "drain_seconds": round(drain_seconds, 3),
        "sqs_requests": total,
        "sqs_requests_per_task": round(total / n, 4),
        "sqs_requests_source": "service counters" if use_counters else "SQS server log",
        "sqs_requests_per_task_server_log": round(logged / n, 4),
        "sqs_requests_by_op": dict(sorted(requests.items())),
        "sqs_counters": counters,
        "dispatcher_calls_by_route": calls,
        "dispatcher_calls_per_task": round(sum(calls.values()) / n, 4),
        "exactly_once": once,
        "exactly_once_counts": counts,
        "republished": republished,
        "republished_per_task": round(republished / n, 4),
        "cpu_wall_seconds": round(wall, 3),
        "cpu_seconds": cpu_split(cpu_before, cpu_after),
        "idle_wait_seconds": idle_wait,
        "sqs_cleanup_seconds": cleanup,
    }
    if blocks:
        figures["postgres_blocks_per_task"] = blocks_per_task(blocks_before, block_io(bs), n)
    return figures


def measure_latency(
    bs: BenchStack, sizes: Sizes, label: str, *, tasks: int | None = None, rate: float | None = None
) -> dict[str, Any]:
    """One run of W2: `tasks` (`sizes.w2_tasks`) no-op tasks (operator `lat`), one by one at `rate`
    (`sizes.w2_rate`) per second; enqueue-to-start = the operator's start minus the client's time
    just before the POST."""
    n = tasks or sizes.w2_tasks
    rate = rate or sizes.w2_rate
    idle_wait = bs.wait_idle()
    bodies = [{"operator": "lat"} for _ in range(n)]

    def submit(
        on_done: Callable[[int], None], stop: threading.Event
    ) -> Coroutine[Any, Any, Submitted]:
        return submit_paced(
            bs.dispatcher_url, bs.headers, bodies, rate=rate, on_done=on_done, stop=stop
        )

    cpu_before = bs.cpu_snapshot()
    submitted = submit_and_drain(bs, n, submit, label)
    cpu_after = bs.cpu_snapshot()
    stages = {row["task_id"]: row for row in bs.query("latency_stages", ids=submitted.task_ids)}
    latencies = sorted(
        (stages[task_id]["started"] - sent) * 1000
        for task_id, sent in zip(submitted.task_ids, submitted.sent_at, strict=True)
        if task_id in stages and stages[task_id]["started"] is not None
    )
    once, _ = _exactly_once(bs, submitted.task_ids)
    span = submitted.sent_at[-1] - submitted.sent_at[0] if n > 1 else 0.0
    return {
        "tasks": n,
        "rate": round((n - 1) / span, 1) if span > 0 else 0.0,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(latencies[-1], 2) if latencies else float("nan"),
        "mean_ms": round(sum(latencies) / len(latencies), 2) if latencies else float("nan"),
        "without_start_time": n - len(latencies),
        "stages_p50_ms": _stages(submitted, stages),
        "exactly_once": once,
        "idle_wait_seconds": idle_wait,
        # A lone task's CPU by process: what keeps the cores busy between the hops.
        "cpu_wall_seconds": round(cpu_after.wall - cpu_before.wall, 3),
        "cpu_seconds": cpu_split(cpu_before, cpu_after),
    }


STAGES = (
    ("request_to_created", "sent_at", "created"),
    ("created_to_claimed", "created", "claimed"),
    ("created_to_wakeup_sent", "created", "sent"),
    ("wakeup_sent_to_claimed", "sent", "claimed"),
    ("claimed_to_operator_start", "claimed", "started"),
)
# Stages of a task claimed after an SQS wake-up was sent for it (not by a waiting claim first).
WAKEUP_STAGES = ("created_to_wakeup_sent", "wakeup_sent_to_claimed")


def _stages(submitted: Submitted, rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Median of each stage of enqueue-to-start (ms), over the tasks that have both ends (the
    wake-up's stages over the tasks claimed after their wake-up was sent), and the share of the
    tasks claimed before any wake-up of theirs was sent (`claimed_without_wakeup`, a fraction)."""
    values: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    without_wakeup = claimed = 0
    for task_id, sent_at in zip(submitted.task_ids, submitted.sent_at, strict=True):
        row = rows.get(task_id)
        if row is None:
            continue
        points = {**row, "sent_at": sent_at}
        woken = points.get("sent") is not None and points.get("claimed") is not None
        woken = woken and points["sent"] <= points["claimed"]
        if points.get("claimed") is not None:
            claimed += 1
            without_wakeup += not woken
        for name, start, end in STAGES:
            if name in WAKEUP_STAGES and not woken:
                continue
            if points.get(start) is not None and points.get(end) is not None:
                values[name].append((points[end] - points[start]) * 1000)
    stages = {
        name: round(percentile(sorted(found), 50), 2) for name, found in values.items() if found
    }
    if claimed:
        stages["claimed_without_wakeup"] = round(without_wakeup / claimed, 3)
    return stages


def prefill(bs: BenchStack, rows: int) -> dict[str, Any]:
    """W4's setup: `rows` finished tasks with one attempt each, then VACUUM ANALYZE."""
    bs.wait_idle()
    bs.say(f"W4: inserting {rows:,} finished tasks and their attempts ...")
    started = time.monotonic()
    bs.query_exec("prefill", rows=rows)
    inserted = time.monotonic()
    bs.say(f"W4: inserted in {inserted - started:.1f}s; VACUUM ANALYZE ...")
    bs.query_exec("vacuum")
    sizes = bs.one("table_rows")
    return {
        "rows": rows,
        "insert_seconds": round(inserted - started, 1),
        "vacuum_seconds": round(time.monotonic() - inserted, 1),
        "tasks_rows": int(sizes["tasks"]),
        "attempts_rows": int(sizes["attempts"]),
        "tables_mib": round(int(sizes["bytes"]) / 1024 / 1024, 1),
    }
