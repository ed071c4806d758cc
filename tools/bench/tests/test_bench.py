"""`make bench` (taskplat.bench): its arithmetic and parsing, and one end-to-end run
of the whole benchmark on tiny sizes that checks the result file holds every figure."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.bench.config import (
    BASE_ENV,
    LEASE_TTL,
    WORKLOADS,
    make_config,
    parse_variant,
    parse_workloads,
)
from taskplat.bench.harness import QUERIES, operators_file
from taskplat.bench.operators import HANDLERS, serve
from taskplat.bench.report import block_lines, figure_rows, missing_figures
from taskplat.bench.stats import combine, percentile, spread
from taskplat.bench.throughput import blocks_per_task
from taskplat.devstack.errors import DevstackError


def test_a_variant_is_a_name_and_environment_overrides() -> None:
    assert parse_variant("baseline").env == {}
    variant = parse_variant("ahead=TASKPLAT_WORKER_CLAIM_AHEAD=true,TASKPLAT_X=a=b")
    assert variant.name == "ahead"
    assert dict(variant.env) == {"TASKPLAT_WORKER_CLAIM_AHEAD": "true", "TASKPLAT_X": "a=b"}
    for bad in ("", "a b", "x=NOVALUE", "x=1BAD=2"):
        with pytest.raises(DevstackError):
            parse_variant(bad)


def test_workloads_are_chosen_by_name_in_a_fixed_order() -> None:
    assert parse_workloads(None) == WORKLOADS
    assert parse_workloads("w4, W1") == ("W1", "W4")
    with pytest.raises(DevstackError):
        parse_workloads("W9")


def test_a_variant_overrides_the_production_defaults_and_a_workload_the_variant() -> None:
    config = make_config(
        run_dir=Path("/tmp/x"),
        results_dir=Path("/tmp/y"),
        runs=None,
        only=None,
        variants=["v=TASKPLAT_WORKER_CONCURRENCY=2"],
        quick=False,
    )
    env = config.stack_env(config.variants[0], {LEASE_TTL: "5"})
    assert env["TASKPLAT_WORKER_CONCURRENCY"] == "2"
    assert env[LEASE_TTL] == "5"
    assert env["TASKPLAT_WORKER_WAIT_TIME_SECONDS"] == BASE_ENV["TASKPLAT_WORKER_WAIT_TIME_SECONDS"]
    assert config.runs == 3 and config.sizes.w1_tasks == 5000


def test_runs_combine_into_medians_and_guarantees_into_all() -> None:
    runs = [
        {"rate": 10.0, "ok": True, "by_op": {"a": 1}, "note": "x"},
        {"rate": 30.0, "ok": False, "by_op": {"a": 3, "b": 1}, "note": "y"},
        {"rate": 20.0, "ok": True, "by_op": {"a": 2}, "note": "z"},
    ]
    assert combine(runs) == {"rate": 20.0, "ok": False, "by_op": {"a": 2, "b": 1}, "note": "z"}
    assert spread([{"W": r} for r in runs], ("W", "rate")) == (10.0, 30.0)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert math.isnan(percentile([], 50))


def test_missing_figures_names_each_empty_cell() -> None:
    record = {
        "settings": {
            "workloads": ["W2"],
            "sizes": {"w3_lease_ttls": [5.0]},
            "worker_wrappers": 2,
        },
        "variants": [{"name": "v", "figures": {"W2": {"p50_ms": 1.0, "p95_ms": float("nan")}}}],
    }
    assert missing_figures(record) == ["v: W2 enqueue-to-start p95", "v: W2 enqueue-to-start p99"]
    labels = [row.label for row in figure_rows(list(WORKLOADS), [5.0, 30.0], 2)]
    assert "W3 lease 30s: kill to re-start" in labels
    assert "peak RSS worker-2 (W1)" in labels


def test_the_operators_file_sizes_the_pool_to_the_concurrency(tmp_path: Path) -> None:
    text = operators_file(tmp_path, 3).read_text()
    assert "pool_size: 3" in text
    assert "{operators_py}" not in text
    script = Path(text.split('"{python}", ', 1)[1].split(",", 1)[0].strip('"'))
    assert script.name == "operators.py" and script.is_file()


def test_the_operators_answer_each_task_line_with_their_own_timestamps() -> None:
    out = io.StringIO()
    before = time.time()
    tasks = [
        {"task_id": "a", "config": {"seconds": 0}},
        {"task_id": "b", "config": {"seconds": 0.01}},
    ]
    lines = f"{json.dumps(tasks[0])}\n\n{json.dumps(tasks[1])}\nx\n"
    assert serve(HANDLERS["sleep"], io.StringIO(lines), out) == 0
    first, second, bad = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["status"] == second["status"] == "succeeded"
    assert before <= first["payload"]["started"] <= first["payload"]["finished"]
    assert second["payload"]["finished"] - second["payload"]["started"] >= 0.01
    assert bad["status"] == "failed"


@pytest.mark.e2e
@pytest.mark.timeout(330)  # W6 adds the broker and the query service to the stack
def test_a_quick_bench_writes_every_figure(tmp_path: Path) -> None:
    results = tmp_path / "results"
    argv = [
        sys.executable,
        "-m",
        "taskplat.bench",
        "--quick",
        "--dir",
        str(tmp_path / "run"),
        "--results",
        str(results),
        "--w1-tasks",
        "50",
        "--w2-tasks",
        "20",
        "--w2-rate",
        "20",
        "--w3-sleep",
        "3",
        "--w3-lease-ttls",
        "3",
        "--w4-rows",
        "2000",
        "--w5-records",
        "1000",
        "--w6-queries",
        "5",
        "--w7-key-tasks",
        "40",
        "--w7-rate-tasks",
        "30",
        # One stack for everything: its lease TTL is W3's; short polls for a quick stop.
        "--variant",
        f"smoke={LEASE_TTL}=3,TASKPLAT_WORKER_WAIT_TIME_SECONDS=1,"
        "TASKPLAT_WORKER_POLL_WAIT_SECONDS=1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((results / "latest.json").read_text())
    assert record["missing_figures"] == []
    (variant,) = record["variants"]
    assert variant["errors"] == {}
    figures = variant["figures"]
    assert figures["W1"]["exactly_once"] is True
    assert figures["W1"]["sqs_requests_per_task"] > 0
    assert figures["W4"]["exactly_once"] is True
    assert figures["W5"]["exactly_once"] is True
    assert figures["W5"]["records_per_second"] > 0
    assert figures["W6"]["queries_per_second"] > 0 and figures["W6"]["cpu_ms_per_query"] > 0
    assert figures["W7"]["unbinding"]["exactly_once"] is True
    assert figures["W7"]["unbinding"]["drain_ratio_to_W1"] > 0
    assert figures["W7"]["rate"]["tasks"] == 30
    assert figures["W2"]["p50_ms"] > 0
    assert figures["W2"]["cpu_seconds"]["dispatcher"] > 0
    assert figures["W2"]["unloaded"]["p50_ms"] > 0
    assert figures["W2"]["unloaded"]["rate"] < figures["W2"]["rate"]
    recovery = figures["W3"]["lease_ttl_3s"]
    assert recovery["completed_once"] is True
    assert recovery["operator_died_with_wrapper"] is True
    assert 0 < recovery["recovery_seconds"] < 30
    assert set(figures["memory"]) >= {"dispatcher", "relay", "scheduler", "reaper", "worker-1"}
    machine = record["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0
    assert machine["postgres"]["fsync"] == "on"
    assert machine["postgres"]["synchronous_commit"] == "on"
    assert "W1 drain rate" in done.stdout
    markdown = (results / "latest.md").read_text()
    assert "| W1 drain rate |" in markdown
    assert "CPU during W2 (20 tasks;" in markdown


def test_postgres_blocks_are_counted_per_task_by_relation(db_url: str) -> None:
    """`block_io` names every table and index of the database; `blocks_per_task` divides a
    run's accesses by its tasks and names the busiest relations first."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(QUERIES["block_io"]).fetchall()
    relations = {row["relation"] for row in rows}
    assert {"table tasks", "index tasks_pkey", "table outbox"} <= relations
    assert all(row["hit"] >= 0 and row["read"] >= 0 for row in rows)
    before = {"table tasks": (100, 5), "index tasks_pkey": (10, 0), "table outbox": (7, 1)}
    after = {"table tasks": (300, 9), "index tasks_pkey": (70, 2), "table outbox": (7, 1)}
    figures = blocks_per_task(before, after, tasks=4)
    assert figures["hit"] == 65.0 and figures["read"] == 1.5
    assert list(figures["by_relation"]) == ["table tasks", "index tasks_pkey", "table outbox"]
    assert figures["by_relation"]["index tasks_pkey"] == {"hit": 15.0, "read": 0.5}
    record = {"figures": {"W4": {"postgres_blocks_per_task": figures}}}
    (line, _) = block_lines(record, "W4")
    assert "65 hit, 1.5 read" in line and "table tasks 50/1" in line
