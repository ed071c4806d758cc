"""Flow control against the real Postgres (migrations 0027, 0028): queue and key concurrency
limits, the rate limit, priority and fairness between keys, on the dispatcher's own claim
statements and the end functions every service calls.

Limits are measured from the attempts' own start and end times (task_attempts), never by
sampling: at no instant do more attempts of a queue (or of one key) overlap than its limit, and
no window of t seconds holds more than `burst + per_second * t` starts.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from taskplat.common.db.queries import load_queries, parse_queries
from taskplat.devstack.flow_checks import max_running

_SQL_PATH = Path(__file__).with_name("flow_limits_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
BATCH = load_queries("taskplat.dispatcher.repository", "batch.sql")
TASKS = load_queries("taskplat.dispatcher.repository", "tasks.sql")
Row = dict[str, Any]


def _queue() -> str:
    return f"q-{uuid4().hex[:12]}"


def _run(conn: psycopg.Connection[Row], name: str, **params: Any) -> list[Row]:
    cursor = conn.execute(ROWS[name], params)
    return cursor.fetchall() if cursor.description else []


def _connect(url: str) -> psycopg.Connection[Row]:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def _claim_params(queue: str) -> dict[str, Any]:
    return {
        "queue": queue, "worker_id": "w-1", "lease_seconds": 30, "default_timeout_seconds": 60,
        "now": None, "capability_keys": True, "untrusted_operators": [],
    }  # fmt: skip


def claim_next(conn: psycopg.Connection[Row], queue: str, limit: int) -> list[Row]:
    return conn.execute(BATCH["claim_next"], {**_claim_params(queue), "max": limit}).fetchall()


def claim_by_id(conn: psycopg.Connection[Row], queue: str, task_id: UUID) -> list[Row]:
    params = {**_claim_params(queue), "task_id": task_id, "lease_token": uuid4()}
    return conn.execute(TASKS["claim_task"], params).fetchall()


def claim_batch(conn: psycopg.Connection[Row], queue: str, task_ids: list[UUID]) -> list[Row]:
    params = {**_claim_params(queue), "task_ids": task_ids}
    return conn.execute(BATCH["claim_tasks"], params).fetchall()


def complete(conn: psycopg.Connection[Row], row: Row, ended: str = "Completed") -> None:
    done = _run(conn, "complete", task_id=row["task_id"], attempt=row["attempt"],
                lease_token=row["lease_token"], ended=ended)  # fmt: skip
    assert [each["task_id"] for each in done] == [row["task_id"]]


def create(conn: psycopg.Connection[Row], queue: str, keys: Sequence[str | None],
           priorities: list[int] | None = None) -> list[UUID]:  # fmt: skip
    rows = _run(conn, "create", queue=queue, keys=keys, priorities=priorities or [5] * len(keys))
    return [row["task_id"] for row in rows]


def set_limits(conn: psycopg.Connection[Row], queue: str, concurrency: int | None = None,
               key_concurrency: int | None = None, per_second: float | None = None,
               burst: int | None = None) -> None:  # fmt: skip
    _run(conn, "set_limits", queue=queue, concurrency=concurrency,
         key_concurrency=key_concurrency, per_second=per_second, burst=burst)  # fmt: skip


def counters_agree(conn: psycopg.Connection[Row], queue: str, counted: bool = True) -> Row:
    """The queue's counters against its Running tasks: equal while a concurrency or key limit is
    set (`counted`), else not kept (0)."""
    [row] = _run(conn, "counters", queue=queue)
    if counted:
        assert row["running"] == row["truly_running"], row
        assert row["keys"] == row["truly_keys"], row
    else:
        assert row["running"] == 0 and row["keys"] == {}, row
    return row


def overlaps(conn: psycopg.Connection[Row], queue: str) -> tuple[int, dict[str, int]]:
    rows = _run(conn, "intervals", queue=queue)
    by_key: dict[str, list[tuple[float, float | None]]] = {}
    spans = [(row["started_at"].timestamp(), _seconds(row["finished_at"])) for row in rows]
    for row, span in zip(rows, spans, strict=True):
        by_key.setdefault(row["key"], []).append(span)
    return max_running(spans), {key: max_running(each) for key, each in by_key.items()}


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def test_a_queue_limit_holds_on_every_claim_path_and_an_end_frees_a_slot(db_url: str) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        set_limits(conn, queue, concurrency=2)
        task_ids = create(conn, queue, [None] * 6)
        claimed = claim_next(conn, queue, 10)
        assert len(claimed) == 2
        held = [task_id for task_id in task_ids if task_id not in {r["task_id"] for r in claimed}]
        assert claim_by_id(conn, queue, held[0]) == []
        assert claim_batch(conn, queue, held[:3]) == []
        assert claim_next(conn, queue, 10) == []
        assert _run(conn, "attempts_of", task_id=held[0]) == [{"n": 0}]  # no attempt spent
        [refusal] = _run(conn, "refusal", queue=queue, key=None)
        assert refusal["reason"] == "ConcurrencyLimited" and refusal["retry_after_ms"] > 0
        counters_agree(conn, queue)
        complete(conn, claimed[0])
        assert [row["task_id"] for row in claim_by_id(conn, queue, held[0])] == [held[0]]
        assert counters_agree(conn, queue)["running"] == 2


@pytest.mark.parametrize("end", ["Completed", "Failed", "cancel", "reap"])
def test_every_end_of_a_running_task_releases_its_slot(db_url: str, end: str) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        set_limits(conn, queue, concurrency=1, key_concurrency=1)
        create(conn, queue, ["k", "k"])
        [row] = claim_next(conn, queue, 5)
        assert claim_next(conn, queue, 5) == []
        if end in ("Completed", "Failed"):
            complete(conn, row, end)
        elif end == "cancel":
            assert [r["task_id"] for r in _run(conn, "cancel", task_id=row["task_id"])] == [
                row["task_id"]
            ]
        else:
            assert row["task_id"] in {r["task_id"] for r in _run(conn, "reap")}
        assert counters_agree(conn, queue)["running"] == 0
        assert len(claim_next(conn, queue, 5)) == 1


def test_claim_next_passes_over_the_keys_at_their_limit(db_url: str) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        set_limits(conn, queue, key_concurrency=1)
        create(conn, queue, ["a"] * 5 + ["b"] * 5)
        first = claim_next(conn, queue, 10)
        assert sorted(_keys(conn, first)) == ["a", "b"]
        assert claim_next(conn, queue, 10) == []
        [refusal] = _run(conn, "refusal", queue=queue, key="a")
        assert refusal["reason"] == "KeyConcurrencyLimited"
        complete(conn, first[0])
        again = claim_next(conn, queue, 10)
        assert _keys(conn, again) == _keys(conn, first[:1])
        counters_agree(conn, queue)


def _keys(conn: psycopg.Connection[Row], rows: list[Row]) -> list[str]:
    found = conn.execute(
        "SELECT task_id, concurrency_key FROM tasks WHERE task_id = ANY(%s)",
        ([row["task_id"] for row in rows],),
    ).fetchall()
    key = {each["task_id"]: each["concurrency_key"] for each in found}
    return [key[row["task_id"]] for row in rows]


def test_a_key_queued_behind_a_thousand_of_another_starts_within_a_few_starts(
    db_url: str,
) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        create(conn, queue, ["big"] * 1000)
        small = set(create(conn, queue, ["small"] * 4))
        order = [row["task_id"] for _ in range(12) for row in claim_next(conn, queue, 1)]
    positions = [index for index, task_id in enumerate(order) if task_id in small]
    assert len(positions) == 4 and positions[-1] < 10, positions


def test_priority_comes_before_the_keys_turns(db_url: str) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        create(conn, queue, ["a"] * 20 + ["b"] * 20)
        [urgent] = create(conn, queue, ["a"], [0])
        assert [row["task_id"] for row in claim_next(conn, queue, 1)] == [urgent]


def test_a_rate_limit_allows_the_burst_then_the_rate(db_url: str) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        set_limits(conn, queue, per_second=2, burst=3)
        create(conn, queue, [None] * 10)
        assert len(claim_next(conn, queue, 10)) == 3
        assert claim_next(conn, queue, 10) == []
        [refusal] = _run(conn, "refusal", queue=queue, key=None)
        assert refusal["reason"] == "RateLimited" and 0 < refusal["retry_after_ms"] <= 500


def _hammer(url: str, queue: str, task_ids: list[UUID], seconds: float, seed: int) -> None:
    """One claimer: claim-next, by id or in a batch at random, complete soon after; until the
    queue is drained or `seconds` passed."""
    rand = random.Random(seed)
    deadline = datetime.now().timestamp() + seconds
    with _connect(url) as conn:
        while datetime.now().timestamp() < deadline:
            way = rand.random()
            if way < 0.5:
                rows = claim_next(conn, queue, rand.randint(1, 4))
            elif way < 0.8:
                rows = claim_by_id(conn, queue, rand.choice(task_ids))
            else:
                rows = claim_batch(conn, queue, rand.sample(task_ids, 3))
            for row in rows:
                complete(conn, row)
            left = conn.execute(
                "SELECT count(*) AS n FROM tasks WHERE queue = %s AND status <> 'Completed'",
                (queue,),
            ).fetchone()
            if left is not None and left["n"] == 0:
                return


@pytest.mark.parametrize("round_", range(3))
def test_truly_concurrent_claims_never_exceed_the_limits_and_reach_them(
    db_url: str, round_: int
) -> None:
    queue = _queue()
    with _connect(db_url) as conn:
        set_limits(conn, queue, concurrency=3, key_concurrency=2)
        task_ids = create(conn, queue, [f"k{i % 3}" for i in range(150)])
    threads = [
        threading.Thread(target=_hammer, args=(db_url, queue, task_ids, 60, round_ * 10 + i))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    with _connect(db_url) as conn:
        whole, per_key = overlaps(conn, queue)
        counters_agree(conn, queue)
        done = conn.execute(
            "SELECT count(*) AS n FROM tasks WHERE queue = %s AND status = 'Completed'", (queue,)
        ).fetchone()
    assert done is not None and done["n"] == 150
    assert whole <= 3 and max(per_key.values()) <= 2, (whole, per_key)
    assert whole == 3, "eight claimers never reached the queue's limit"


def test_a_token_bucket_never_starts_more_than_burst_plus_rate_times_t(db_url: str) -> None:
    queue = _queue()
    per_second, burst = 20.0, 3
    with _connect(db_url) as conn:
        set_limits(conn, queue, per_second=per_second, burst=burst)
        task_ids = create(conn, queue, [None] * 40)
    threads = [
        threading.Thread(target=_hammer, args=(db_url, queue, task_ids, 30, i)) for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    with _connect(db_url) as conn:
        starts = sorted(row["started_at"] for row in _run(conn, "intervals", queue=queue))
    assert len(starts) == 40
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = (starts[j] - first).total_seconds()
            assert j - i + 1 <= burst + per_second * window + 1e-6, (i, j, window)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 2), st.integers(0, 9)),
        st.tuples(st.just("claim_next"), st.integers(1, 4)),
        st.tuples(st.just("claim_by_id"), st.integers(0, 30)),
        st.tuples(st.just("end"), st.sampled_from(["Completed", "Failed", "cancel"])),
        st.tuples(
            st.just("limits"),
            st.one_of(st.none(), st.integers(1, 3)),
            st.one_of(st.none(), st.integers(1, 2)),
        ),
    ),
    min_size=5,
    max_size=40,
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(ops=OPS, start=st.tuples(st.one_of(st.none(), st.integers(1, 3)),
                                st.one_of(st.none(), st.integers(1, 2))))  # fmt: skip
def test_any_sequence_of_creates_claims_ends_and_limit_changes_keeps_the_counters_true(
    db_url: str, ops: list[tuple[Any, ...]], start: tuple[int | None, int | None]
) -> None:
    """A property: after every step the counters equal the Running tasks, per queue and per key,
    and a claim that starts anything leaves no more Running than the limits in force (lowering
    a limit stops nothing that runs)."""
    queue = _queue()
    limits = start
    with _connect(db_url) as conn:
        set_limits(conn, queue, *limits)
        created: list[UUID] = []
        running: list[Row] = []
        for op in ops:
            before = counters_agree(conn, queue, limits != (None, None))
            started: list[Row] = []
            if op[0] == "create":
                created += create(conn, queue, [f"k{op[1]}"], [op[2]])
            elif op[0] == "claim_next":
                started = claim_next(conn, queue, op[1])
            elif op[0] == "claim_by_id" and created:
                started = claim_by_id(conn, queue, created[op[1] % len(created)])
            elif op[0] == "end" and running:
                row = running.pop(0)
                if op[1] == "cancel":
                    _run(conn, "cancel", task_id=row["task_id"])
                else:
                    complete(conn, row, op[1])
            elif op[0] == "limits":
                limits = (op[1], op[2])
                set_limits(conn, queue, *limits)
            running += started
            after = counters_agree(conn, queue, limits != (None, None))
            concurrency, key_concurrency = limits
            if started and concurrency is not None:
                assert after["truly_running"] <= concurrency, (limits, before, after)
            if started and key_concurrency is not None:
                for key in _keys(conn, started):
                    assert after["truly_keys"][key or ""] <= key_concurrency, (limits, after)
