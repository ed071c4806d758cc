"""Rules of the core stated once: the creation, the cancel and the storing of outputs.

Every task comes to be through the one creation (taskplat_create_tasks, migration 0023).

The dispatcher's creates (one task or a batch), job runs by hand, by schedule and routed from a
dataset event all call it. A second statement or function that inserts into `tasks`, or writes an
`enqueue_task` outbox row other than the wake-up function, fails here: its copy of the rules (the
starting state, pins, the held wake-up and its NOTIFY) would drift. A job run is created as a
create is: its wake-up is held for a queue whose workers wait on a dispatcher, and the waiting
claims hear of it on `taskplat_queued`.

Likewise every cancel (by request, or by a dataset version that stops being current) is
taskplat_cancel_tasks, the fence of a write made while an attempt runs (its events, its steps) is
taskplat_share_fence, and every output an accepted success commits (on time or late) is stored
by taskplat_store_results.

What makes a Queued task claimable of itself (unexpired, trusted unless the claimer holds
capability keys) is taskplat_claimable, inlined by the planner where the claims call it (so
claim-next keeps its index); that its queue is not paused is the admission trigger's
(taskplat_admit_start), which every start passes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.common.db.queries import parse_queries

_SQL_PATH = Path(__file__).with_name("one_home_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2030, 1, 1, tzinfo=UTC)

INSERTS_TASKS = re.compile(r"\binsert\s+into\s+(public\.)?tasks\b", re.IGNORECASE)
WRITES_OUTBOX = re.compile(r"\binsert\s+into\s+(public\.)?outbox\b", re.IGNORECASE)
# The functions that may do either, and why.
CREATES_TASKS = {
    "taskplat_create_tasks": "the one creation",
    # A buffered dataset's producer record: Completed at birth, never queued, claimed or woken.
    "taskplat_add_dataset_table": "the sink's producer record",
}
WRITES_WAKEUPS = {"taskplat_enqueue_wakeups": "the one wake-up"}
CANCELS = re.compile(r"\bstatus\s*=\s*'Canceled'\s*,", re.IGNORECASE)  # set, not tested
STORES_OUTPUTS = re.compile(r"\binsert\s+into\s+(public\.)?task_outputs\b", re.IGNORECASE)
# A write made while an attempt runs share-locks its fenced task.
SHARES_FENCE = re.compile(r"status\s*=\s*'Running'[^;]{0,300}?\bFOR\s+SHARE\b", re.IGNORECASE)
# The expiry test of a claim, or the trust test of a claimer (its capability keys).
CLAIMABLE = re.compile(
    r"expires_at\s*>\s*(?:[pv]_now|coalesce)|capability_keys\s+OR\s+NOT\s+taskplat_untrusted",
    re.IGNORECASE,
)
# A start refused for its paused queue (reads of `paused` that report it are not this rule).
PAUSED = re.compile(r"\bq\.paused\b(?!\s+AS\b)", re.IGNORECASE)
ONE_HOME = {
    "claimable": (CLAIMABLE, {"taskplat_claimable"}),
    "cancel": (CANCELS, {"taskplat_cancel_tasks"}),
    "share-fence": (SHARES_FENCE, {"taskplat_share_fence"}),
    "outputs": (STORES_OUTPUTS, {"taskplat_store_results"}),
}


def _production_sources() -> list[Path]:
    """The SQL and Python of every service and library (tests and tools excluded: their fixtures
    write rows in any state on purpose); migrations are checked in the migrated schema instead."""
    found: list[Path] = []
    for top in ("services", "libs"):
        for path in sorted((ROOT / top).glob("*/src/**/*")):
            if path.suffix in (".sql", ".py") and "migrations" not in path.parts:
                if path.name != "schema.sql":
                    found.append(path)
    return found


def _writes_wakeup(source: str) -> bool:
    return bool(WRITES_OUTBOX.search(source)) and "'enqueue_task'" in source


def test_no_function_but_the_creation_inserts_tasks_or_writes_wakeups(db_url: str) -> None:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        functions = conn.execute(ROWS["function_sources"]).fetchall()
    assert {f["name"] for f in functions} >= set(CREATES_TASKS) | set(WRITES_WAKEUPS)
    inserting = {f["name"] for f in functions if INSERTS_TASKS.search(f["source"])}
    waking = {f["name"] for f in functions if _writes_wakeup(f["source"])}
    assert inserting == set(CREATES_TASKS)
    assert waking == set(WRITES_WAKEUPS)


@pytest.mark.parametrize("rule", sorted(ONE_HOME))
def test_one_function_states_the_rule(db_url: str, rule: str) -> None:
    pattern, homes = ONE_HOME[rule]
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        functions = conn.execute(ROWS["function_sources"]).fetchall()
    assert {f["name"] for f in functions if pattern.search(f["source"])} == homes
    offenders = [
        str(path.relative_to(ROOT))
        for path in _production_sources()
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_only_the_admission_refuses_a_paused_queues_start(db_url: str) -> None:
    """Of the schema's functions, only the admission trigger tests a task's queue for `paused`
    (claim-next's early return reads the row it holds already)."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        functions = conn.execute(ROWS["function_sources"]).fetchall()
    assert {f["name"] for f in functions if PAUSED.search(f["source"])} == {"taskplat_admit_start"}


def test_no_statement_of_a_service_inserts_tasks_or_writes_wakeups() -> None:
    sources = _production_sources()
    assert any(path.name == "tasks.sql" for path in sources)  # the scan finds the statements
    offenders = [
        str(path.relative_to(ROOT))
        for path in sources
        if INSERTS_TASKS.search(text := path.read_text(encoding="utf-8")) or _writes_wakeup(text)
    ]
    assert offenders == []


def _run(conn: psycopg.Connection[Any], *, hold: float, key: str) -> dict[str, Any]:
    row = conn.execute(
        ROWS["start_job_run"], {"dag": "d", "key": key, "now": NOW, "hold": hold}
    ).fetchone()
    assert row is not None and row["task_id"] is not None
    task = conn.execute(ROWS["task"], {"task_id": row["task_id"]}).fetchone()
    assert task is not None
    return task


@pytest.mark.parametrize("polled", [True, False], ids=["polled", "not-polled"])
def test_a_job_run_is_created_as_a_create_is(db_url: str, polled: bool) -> None:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as listener:
        listener.execute("LISTEN taskplat_queued")
        listener.execute("LISTEN taskplat_outbox")
        with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
            conn.execute(ROWS["insert_job"], {"dag": "d", "queue": "q"})
            if polled:
                conn.execute(ROWS["poll_queue"], {"queue": "q", "until": NOW + timedelta(hours=1)})
            task = _run(conn, hold=2.0, key="k1")
            wakeups = conn.execute(ROWS["wakeups"], {"task_id": task["task_id"]}).fetchall()
            again = conn.execute(
                ROWS["start_job_run"], {"dag": "d", "key": "k1", "now": NOW, "hold": 2.0}
            ).fetchone()
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert (task["status"], task["queue"], task["operator"]) == ("Queued", "q", "probe")
    assert (task["queued_at"], task["created_at"], task["updated_at"]) == (NOW, NOW, NOW)
    assert task["job"] == {"dag_name": "d", "name": "run"}
    assert (task["max_attempts"], task["timeout_seconds"], task["on_exhausted"]) == (
        4,
        30,
        "discard",
    )
    assert task["config"] == {"a": 1}
    if polled:
        assert [(w["held"], w["available_at"]) for w in wakeups] == [
            (True, NOW + timedelta(seconds=2))
        ]
        assert heard == [("taskplat_queued", "q")]
    else:
        assert [(w["held"], w["available_at"]) for w in wakeups] == [(False, NOW)]
        assert heard == [("taskplat_outbox", "q")]
    assert again is not None and again["task_id"] is None  # the key is taken: nothing new


def test_the_claimable_rule_is_inlined_where_it_is_called(db_url: str) -> None:
    """taskplat_claimable is plain SQL: the planner replaces the call by its expression, so
    claim-next's pick still reads the Queued index in order."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(ROWS["explain_pick"]).fetchone()
    assert plan is not None
    text = json.dumps(plan)
    assert "taskplat_claimable" not in text
    assert "tasks_queued_claim_idx" in text
