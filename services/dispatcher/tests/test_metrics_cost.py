"""The cost of /metrics on a platform with history: on 200k finished tasks (and their 200k sent
outbox rows), no gauge query scans `tasks` or `outbox` sequentially, each uses a partial index
(before and after ANALYZE), and the gauges still count exactly the unfinished tasks. Prints the
measured cost (asserts no timing)."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Any

import psycopg
from dispatcher_metrics import analyze, fill_history, scrape
from psycopg import sql

from taskplat.common.db.queries import load_queries
from taskplat.testkit.dispatcher_calls import claimed, complete, create_task
from taskplat.testkit.dispatcher_harness import serve_dispatcher

HISTORY = 200_000
STATUS_INDEX = "tasks_status_created_idx"
GAUGE_QUERIES = load_queries("taskplat.dispatcher.repository", "metrics.sql")
TABLE_PAGES = "SELECT pg_relation_size('tasks') / current_setting('block_size')::int"
_PARTIAL_INDEXES = """
SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indpred IS NOT NULL
"""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> dict[str, Any]:
    statement = sql.SQL("EXPLAIN (FORMAT JSON) {}").format(sql.SQL(query))  # type: ignore[arg-type]
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _check_plans(db_url: str, params: dict[str, Any]) -> dict[str, list[str]]:
    """Every gauge query's plan: no Seq Scan of tasks or outbox, and a partial index used; the
    indexes each plan uses (by name)."""
    used: dict[str, list[str]] = {}
    with psycopg.connect(db_url) as conn:
        partial = {row[0] for row in conn.execute(_PARTIAL_INDEXES)}
        for name, query in GAUGE_QUERIES.items():
            nodes = _nodes(_explain(conn, query, params))
            scans = [
                (node["Node Type"], node["Relation Name"])
                for node in nodes
                if node.get("Relation Name") in ("tasks", "outbox")
            ]
            assert scans, (name, nodes)
            assert all(node_type != "Seq Scan" for node_type, _ in scans), (name, scans)
            indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
            # A partial index, or the (status, created_at) index's range of the one status named:
            # either reads only the rows of that status.
            assert indexes and indexes <= partial | {STATUS_INDEX}, (name, indexes)
            used[name] = sorted(indexes)
    return used


def _measure(db_url: str, params: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Each gauge query's execution time (ms) and shared buffers touched, by EXPLAIN ANALYZE."""
    measured: dict[str, tuple[float, int]] = {}
    with psycopg.connect(db_url) as conn:
        for name, query in GAUGE_QUERIES.items():
            statement = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(
                sql.SQL(query)  # type: ignore[arg-type]
            )
            row = conn.execute(statement, params).fetchone()
            assert row is not None
            plan = row[0][0]
            top = plan["Plan"]
            blocks = int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
            measured[name] = (float(plan["Execution Time"]), blocks)
    return measured


def _table_pages(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(TABLE_PAGES).fetchone()
        assert row is not None
        return int(row[0])


def test_gauges_use_partial_indexes_on_200k_finished_tasks(db_url: str) -> None:
    with serve_dispatcher(db_url) as dispatcher:
        clock = dispatcher.clock
        now = clock.now()
        fill_history(db_url, HISTORY, now)
        # The unfinished work of the moment: 3 Queued, 1 Scheduled, 1 Running, 1 Failed and one
        # task that just died.
        for _ in range(3):
            create_task(dispatcher, queue="q1")
        create_task(dispatcher, queue="q2", scheduled_for="2031-01-01T00:00:00Z")
        claimed(dispatcher, create_task(dispatcher, queue="q2")["task_id"])
        retrying = claimed(dispatcher, create_task(dispatcher, queue="q3")["task_id"])
        assert complete(dispatcher, retrying, "Failed").json()["task_status"] == "Failed"
        dying = claimed(dispatcher, create_task(dispatcher, queue="q3", max_attempts=1)["task_id"])
        assert complete(dispatcher, dying, "Failed").json()["task_status"] == "Dead"

        params = {"now": now}
        before_analyze = _check_plans(db_url, params)
        analyze(db_url)
        after_analyze = _check_plans(db_url, params)

        metrics = scrape(dispatcher)
        assert metrics.series("taskplat_tasks_current", "queue", "status") == {
            ("q1", "Queued"): 3,
            ("q2", "Scheduled"): 1,
            ("q2", "Running"): 1,
            ("q3", "Failed"): 1,
        }
        # History: a Dead task every 150 s back from `now`; those within the hour count.
        expected_dead = Counter(
            f"q{i % 8}" for i in range(50, HISTORY, 50) if i * 3 < 3600
        ) + Counter({"q3": 1})
        assert metrics.series("taskplat_tasks_dead_last_hour", "queue", "reason") == {
            (queue, "AttemptsExhausted"): count for queue, count in expected_dead.items()
        }
        assert metrics.series("taskplat_outbox_pending", "kind") == {
            ("enqueue_task",): 6,
            ("dead_letter",): 1,
            ("route_event",): 0,
            ("invoke_lambda",): 0,
        }

        scrapes_ms = []
        for _ in range(20):
            started = time.perf_counter()
            scrape(dispatcher)
            scrapes_ms.append((time.perf_counter() - started) * 1000)
        measured = _measure(db_url, params)
        pages = _table_pages(db_url)

    print(f"\n/metrics cost with {HISTORY} finished tasks and {HISTORY} sent outbox rows:")
    print(
        f"  GET /metrics (gauges read every scrape): median {statistics.median(scrapes_ms):.1f} ms,"
        f" max {max(scrapes_ms):.1f} ms over {len(scrapes_ms)} scrapes"
    )
    for name, (ms, blocks) in measured.items():
        print(
            f"  {name}: {ms:.2f} ms in Postgres, {blocks} buffers (tasks has {pages} pages),"
            f" indexes {after_analyze[name]} (before ANALYZE {before_analyze[name]})"
        )
    # Cheap means reading the unfinished rows and the last hour, not the history.
    for name, (_, blocks) in measured.items():
        assert blocks < pages / 20, (name, blocks, pages)
