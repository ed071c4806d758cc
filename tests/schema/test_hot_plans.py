"""Every hot statement reads only rows that do not grow with history.

On a database with 30,000 finished tasks (their attempts, sent outbox rows, outputs, events) and the
live rows of a busy moment, each statement the dispatcher, the relay, the scheduler
and the reaper run per task or per batch is EXPLAINed twice: with its parameters (the custom plan
of a first execution) and as the generic plan psycopg's prepared statements may settle on after five
executions. That is done twice: after ANALYZE, and on stale statistics taken before the history was
loaded (a young table, or a history loaded in bulk, before autoanalyze runs). No plan may
  * scan tasks, task_attempts, outbox, task_outputs or task_events sequentially;
  * walk a whole non-partial index (an index scan with no Index Cond, e.g. the primary key read in
    order for a LIMIT, which reads every finished row before the live ones);
  * use the listing index tasks_created_idx (it holds every task);
  * read a terminal status's listing index (tasks_<status>_created_idx) by more than a page: it
    grows with history (reading it whole while it is a single page is as cheap as the primary key).
A partial index over Queued (or Scheduled, Failed) rows needs an Index Cond, or a Limit above it
(an ordered walk that stops early): its rows are few when the system keeps up, but a backlog makes
them many (claim-next, planned on statistics of an idle queue, read all 4,120 Queued entries to
update the 4 rows it had locked). Running rows are bounded by the workers' slots, so their indexes
may be read whole. One over history (tasks_finished_idx, outbox_sent_idx) needs an Index Cond, like
a non-partial index. Listing (GET /tasks) is not a hot statement and is not checked here.

A statement that calls a state-change function (the claims of migration 0020, ...) is planned
inside the function: those plans are caught with auto_explain (its nested statements, at NOTICE
level) while the statement runs in a rolled-back transaction, once with custom plans and once with
the generic plans PL/pgSQL settles on, and held to the same rules.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries, parse_queries
from taskplat.testkit.testdb import TemplateDatabases

_SQL_PATH = Path(__file__).with_name("hot_plans_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
HOT_TABLES = ("tasks", "task_attempts", "outbox", "task_outputs", "task_events")
LISTING_INDEX = "tasks_created_idx"
TERMINAL_INDEXES = {f"tasks_{status}_created_idx" for status in ("completed", "dead", "canceled")}
HISTORY_INDEXES = {"tasks_finished_at_idx", "outbox_sent_idx"}
# Running rows are bounded by the workers' slots, unlike Queued ones (a backlog has no bound).
RUNNING_INDEXES = {"tasks_running_lease_idx", "tasks_running_deadline_idx"}
# Plans tolerated on stale statistics only, by statement: none (the dead-letter record, which
# read the Dead listing index whole there, now finds its rows by primary key: migration 0020).
STALE_TOLERATED: dict[tuple[str, str], set[str]] = {}
_PARAM = re.compile(r"%\((\w+)\)s")

Conn = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class Samples:
    queued: UUID
    completed: UUID
    dead: UUID
    running: dict[str, Any]  # task_id, attempt, lease_token of a Running task
    finished: dict[str, Any]  # the same of a Completed task
    last_outbox_id: int


Value = Callable[[Samples], Any]


def _const(value: Any) -> Value:
    return lambda s: value


def _running(key: str) -> Value:
    return lambda s: s.running[key]


# A realistic value for every parameter name the hot statements use; a statement's `Task` says
# which sample task it names. A new parameter name fails the test until it gets a value here.
VALUES: dict[str, Value] = {
    "now": _const(None),
    "queue": _const("q1"),
    "queues": _const(["q1"]),
    "operator": _const("echo"),
    "operators": _const(["echo"]),
    "job": _const(None),
    "jobs": _const([None]),
    "config": lambda s: Jsonb({"n": 1}),
    "configs": lambda s: [Jsonb({"n": 1})],
    "inputs": lambda s: Jsonb([]),
    "max_attempts": _const(3),
    "max_processing_attempts": _const(10),
    "on_exhausted": _const("dead_letter"),
    "on_exhausteds": _const(["dead_letter"]),
    "backoff_base_seconds": _const(1.0),
    "backoff_max_seconds": _const(60.0),
    "timeout_seconds": _const(None),
    "scheduled_for": _const(None),
    "expires_at": _const(None),
    "idempotency_key": _const("key-1"),
    "idempotency_keys": _const(["key-1"]),
    "priorities": _const([5]),
    "concurrency_keys": _const(["customer-1"]),
    "keys": _const(["key-1", "key-2"]),
    "trace_context": _const(None),
    "lease_seconds": _const(30.0),
    "default_timeout_seconds": _const(3600),
    "capability_keys": _const(True),
    "untrusted_operators": _const([]),
    "worker_id": _const("w-9"),
    "status": _const("Completed"),
    "result": lambda s: Jsonb({"ok": True}),
    "error_message": _const(None),
    "attempt_error": _const(None),
    "error": _const(None),
    "outcome": _const("Completed"),
    "completion_digest": _const("digest"),
    "retry_after_seconds": _const(None),
    "ended": _const("Completed"),
    "retryable": _const(True),
    "retryables": _const([True]),
    "jitter": _const(0.5),
    "jitters": _const([0.5] * 200),
    "dataset_uuids": lambda s: [uuid4()],
    "dataset_versions": lambda s: [uuid4()],
    "cursors": _const([7]),
    "partition_keys": _const([None]),
    "range_starts": _const([None]),
    "range_ends": _const([None]),
    "output_indexes": _const([0]),
    "output_dataset_uuids": lambda s: [uuid4()],
    "output_dataset_versions": lambda s: [uuid4()],
    "output_cursors": _const([None]),
    "locations": _const([None]),
    "row_counts": _const([None]),
    "limit": _const(100),
    "promote_limit": _const(100),
    "retry_limit": _const(100),
    "max": _const(10),
    "skip_not_queued": _const(True),
    "hold_depth": _const(100),  # the relay's hold of wake-ups deep in a claimed-ahead backlog
    "hold_max_seconds": _const(10.0),
    "hold_evidence_seconds": _const(2.0),
    "ids": lambda s: [s.last_outbox_id],
    "errors": _const(["boom"]),
    "delays": _const([1.0]),
    "grace_seconds": _const(30.0),
    "requeue_after_seconds": _const(60.0),
    "busy_limit": _const(1),  # the scheduler's republish budget of a busy queue
    "closed": _const(["default"]),  # busy queues whose budget is spent
    "busy": _const(["default"]),  # queues seen with a Running task within the period
    "retention_seconds": _const(7 * 86400.0),
    "events": lambda s: Jsonb([]),  # JSON arrays of a bundled completion
    "outputs": lambda s: Jsonb([]),
    "lease_token": lambda s: uuid4(),  # a new lease (claims); a fence names its task's own
    "function_prefix": _const("taskplat-"),
    "outbox_id": lambda s: s.last_outbox_id,
    "polled_wakeup_delay_seconds": _const(1.0),
    "notify_held": _const(True),  # false only while this dispatcher's own claim of the queue waits
}
# Parameter names whose type differs between single and batch statements.
BATCH_VALUES: dict[str, Value] = {
    "inputs": lambda s: [Jsonb([])],
    "max_attempts": _const([3]),
    "max_processing_attempts": _const([10]),
    "backoff_base_seconds": _const([1.0]),
    "backoff_max_seconds": _const([60.0]),
    "timeout_seconds": _const([None]),
    "scheduled_for": _const([None]),
    "expires_at": _const([None]),
}

# The sample task a statement names through task_id (and attempt, lease_token): a Queued one to
# claim or cancel, the Running one to heartbeat or complete, a Completed or Dead one otherwise.
Task = str
HOT_STATEMENTS: dict[tuple[str, str], dict[str, Task]] = {
    ("taskplat.dispatcher.repository", "tasks.sql"): {
        "insert_tasks": "new",
        "get_task_by_idempotency_key": "-",
        "insert_outbox_dead_letter": "dead",
        "get_task": "completed",
        "read_fence": "running",
        "read_fence_for_update": "running",
        "claim_task": "queued",
        "fetch_task": "running",
        "heartbeat": "running",
        "insert_events": "running",
        "complete_running": "running",
        "complete_late": "finished",
        "cancel_task": "queued",
        "replay_task": "dead",
    },
    ("taskplat.dispatcher.repository", "batch.sql"): {
        "claim_tasks": "queued",
        "claim_next": "-",
        "read_fences": "running",
        "find_tasks_by_idempotency_keys": "-",
        "get_tasks": "completed",
    },
    ("taskplat.outbox_relay", "outbox.sql"): {
        "claim_pending": "-",
        "mark_sent": "-",
        "mark_failed": "-",
    },
    ("taskplat.outbox_relay.lambda_invoker", "invoke.sql"): {
        "claim_invocation": "-",
        "claim_for_function": "queued",
        "mark_skipped": "-",
    },
    ("taskplat.scheduler", "scheduler.sql"): {
        "queue_due": "-",
        "republish_unclaimed": "-",
    },
    ("taskplat.reaper", "reaper.sql"): {
        "reap_timeouts": "-",
        "expire_unstarted": "-",
        "prune_finished_tasks": "-",
        "prune_sent_outbox": "-",
    },
}


def _task_values(task: Task, s: Samples) -> dict[str, Any]:
    """task_id (task_ids), attempt and lease_token of the statement's sample task."""
    if task == "new":
        return {"task_id": uuid4(), "task_ids": [uuid4()]}
    if task in ("running", "finished"):
        fence = s.running if task == "running" else s.finished
        return {**fence, "task_ids": [fence["task_id"]]}
    task_id = {"queued": s.queued, "completed": s.completed, "dead": s.dead}.get(task)
    return {} if task_id is None else {"task_id": task_id, "task_ids": [task_id]}


def _params(query: str, task: Task, s: Samples, *, batch: bool) -> dict[str, Any]:
    names = {match.group(1) for match in _PARAM.finditer(query)}
    named = _task_values(task, s)
    if batch:
        named.update({name: value(s) for name, value in BATCH_VALUES.items()})
    missing = sorted(names - set(VALUES) - set(named))
    assert not missing, f"give the parameters {missing} a realistic value in VALUES"
    return {name: named[name] if name in named else VALUES[name](s) for name in names}


def _shipped(package: str, filename: str) -> bool:
    return importlib.resources.files(package).joinpath(filename).is_file()


CASES = [
    pytest.param(package, filename, name, task, id=f"{filename.removesuffix('.sql')}.{name}")
    for (package, filename), statements in HOT_STATEMENTS.items()
    if _shipped(package, filename)
    for name, task in statements.items()
]


@dataclass(frozen=True)
class Index:
    partial: bool
    pages: int


@dataclass(frozen=True)
class History:
    state: str  # "analyzed" or "stale"
    url: str
    samples: Samples
    indexes: dict[str, Index]  # the indexes of the hot tables, by name


@pytest.fixture(scope="module", params=["analyzed", "stale"])
def history(
    template_databases: TemplateDatabases, request: pytest.FixtureRequest
) -> Iterator[History]:
    """The database in one of two states: statistics of the whole history (`analyzed`), or
    statistics taken while only the live rows existed (`stale`: the history came after)."""
    url = template_databases.clone(f"hot_plans_{request.param}")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        if request.param == "analyzed":
            conn.execute(ROWS["fill_history"])
            conn.execute(ROWS["fill_live"])
            conn.execute(ROWS["limit_q1"])
            conn.execute(ROWS["analyze"])
        else:
            conn.execute(ROWS["fill_live"])
            conn.execute(ROWS["limit_q1"])
            conn.execute(ROWS["analyze"])
            conn.execute(ROWS["hold_statistics"])
            conn.execute(ROWS["fill_history"])
        ids = _one(conn, "sample_ids")
        samples = Samples(
            queued=ids["queued"],
            completed=ids["completed"],
            dead=ids["dead"],
            running=_one(conn, "sample_running"),
            finished=_one(conn, "sample_finished_attempt"),
            last_outbox_id=ids["last_outbox_id"],
        )
        indexes = {
            row["index_name"]: Index(row["partial"], row["pages"])
            for row in conn.execute(ROWS["hot_table_indexes"]).fetchall()
        }
    yield History(request.param, url, samples, indexes)
    template_databases.drop(url)


def _one(conn: Conn, name: str) -> dict[str, Any]:
    row = conn.execute(ROWS[name]).fetchone()
    assert row is not None, name
    return row


def _nodes(plan: dict[str, Any], limited: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Each node of the plan, and whether a Limit above it stops the read early."""
    yield plan, limited
    below_limit = limited or plan["Node Type"] == "Limit"
    for child in plan.get("Plans", []):
        yield from _nodes(child, below_limit)


def _violations(plan: dict[str, Any], indexes: dict[str, Index], tolerated: set[str]) -> list[str]:
    found: list[str] = []
    for node, limited in _nodes(plan):
        relation = node.get("Relation Name")
        if relation in HOT_TABLES and node["Node Type"] == "Seq Scan":
            found.append(f"Seq Scan on {relation}")
        name = node.get("Index Name")
        if name not in indexes or name in tolerated:
            continue
        index = indexes[name]
        kind = node["Node Type"]
        if name == LISTING_INDEX:
            found.append(f"{kind} on the listing index {name}")
        elif name in TERMINAL_INDEXES:
            if index.pages > 1:
                found.append(f"{kind} on {name} ({index.pages} pages)")
        elif (not index.partial or name in HISTORY_INDEXES) and not node.get("Index Cond"):
            found.append(f"{kind} reads all of {name} (no Index Cond, {index.pages} pages)")
        elif not node.get("Index Cond") and not limited and name not in RUNNING_INDEXES:
            found.append(f"{kind} reads all of the live index {name} (no Index Cond, no Limit)")
    return found


def _custom_plan(conn: Conn, query: LiteralString, params: dict[str, Any]) -> dict[str, Any]:
    statement = sql.SQL("EXPLAIN (FORMAT JSON) {}").format(sql.SQL(query))
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
    return plan


def _generic_plan(conn: Conn, query: LiteralString, params: dict[str, Any]) -> dict[str, Any]:
    """The plan a prepared statement uses once Postgres settles on a generic plan."""
    conn.execute(ROWS["force_generic_plan"])
    conn.execute(query, params, prepare=True)  # rolled back by the caller
    name = _one(conn, "last_prepared")["name"]
    order: list[str] = []
    for match in _PARAM.finditer(query):
        if match.group(1) not in order:
            order.append(match.group(1))
    statement = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(
        sql.Identifier(name), sql.SQL(", ").join(sql.Placeholder(key) for key in order)
    )
    cursor = psycopg.ClientCursor(conn)  # literal arguments, typed by the prepared statement
    row = cursor.execute(statement, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
    return plan


def _nested_plans(conn: Conn, query: LiteralString, params: dict[str, Any], mode: str) -> list[Any]:
    """The plans of every statement run while `query` runs (those inside the functions it calls
    included), as auto_explain reports them; `mode` is a plan_cache_mode."""
    messages: list[str] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        messages.append(diagnostic.message_primary or "")

    conn.execute(ROWS["load_auto_explain"])
    conn.execute(ROWS["explain_nested"])
    conn.execute(ROWS["plan_cache_mode"], {"mode": mode})
    conn.add_notice_handler(keep)
    try:
        conn.execute(query, params)  # rolled back by the caller
    finally:
        conn.remove_notice_handler(keep)
    plans: list[Any] = []
    for message in messages:
        _, found, body = message.partition("plan:\n")
        if found:
            plans.append(json.loads(body))
    return plans


@pytest.mark.parametrize(("package", "filename", "name", "task"), CASES)
def test_hot_statement_plans_do_not_grow_with_history(
    history: History, package: str, filename: str, name: str, task: Task
) -> None:
    query = load_queries(package, filename)[name]
    batch = filename == "batch.sql" or name == "insert_tasks"  # one array per field
    values = _params(query, task, history.samples, batch=batch)
    with psycopg.connect(history.url, row_factory=dict_row) as conn:
        try:
            custom = _custom_plan(conn, query, values)
            generic = _generic_plan(conn, query, values)
        finally:
            conn.rollback()
    tolerated = STALE_TOLERATED.get((filename, name), set()) if history.state == "stale" else set()
    problems = {
        "custom": _violations(custom, history.indexes, tolerated),
        "generic": _violations(generic, history.indexes, tolerated),
    }
    assert problems == {"custom": [], "generic": []}, (custom, generic)
    for mode in ("force_custom_plan", "force_generic_plan"):
        with psycopg.connect(history.url, row_factory=dict_row) as conn:
            try:
                nested = _nested_plans(conn, query, values, mode)
            finally:
                conn.rollback()
        assert nested, "auto_explain reported no plan"
        inside = {
            plan["Query Text"]: found
            for plan in nested
            if (found := _violations(plan["Plan"], history.indexes, tolerated))
        }
        assert inside == {}, (mode, nested)


def test_the_history_is_what_the_plans_were_checked_on(history: History) -> None:
    """Guards the fixture: the checks above mean something only on a table with history."""
    with psycopg.connect(history.url, row_factory=dict_row) as conn:
        counts = _one(conn, "history_counts")
    assert counts["tasks"] >= 30_000 and counts["sent"] >= 30_000
