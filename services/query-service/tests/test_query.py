"""`POST /query` against a real Postgres (through the `taskplat_query` role), LocalStack's STS and
S3, and the real service on uvicorn: the token's two inputs join; answers come as JSON, CSV and
Arrow IPC, truncated at the limits; bad tokens answer 401; a slow query answers 408 and frees its
slot; a chatty or greedy token answers 429."""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pyarrow as pa
import pytest
from query_harness import (
    Dataset,
    ask,
    buffered_dataset,
    mint,
    served,
    settings,
)

from taskplat.common.clock import FakeClock
from taskplat.common.tokens.keys import private_key_pem
from taskplat.devstack.attempts import end_attempts, running_attempt
from taskplat.devstack.waiting import wait_for

# Runs for hours: a cross product of 3^24 rows of the alerts view (no table function needed).
SLOW = "SELECT sum({}) FROM {}".format(
    " + ".join(f"a{i}.block" for i in range(24)), ", ".join(f"alerts a{i}" for i in range(24))
)
JOIN = (
    "SELECT a.block, a.severity, p.price FROM alerts a JOIN prices p ON p.block = a.block "
    "ORDER BY a.block"
)


def test_the_join_of_a_buffered_and_an_s3_input_returns_the_right_rows(
    service: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    token = mint(inputs)
    answer = ask(service, token, JOIN)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["columns"] == [
        {"name": "block", "type": "BIGINT"},
        {"name": "severity", "type": "VARCHAR"},
        {"name": "price", "type": "DOUBLE"},
    ]
    assert body["rows"] == [[1, "low", 1.5], [2, "critical", 3.0]]
    assert (body["row_count"], body["truncated"]) == (2, False)
    assert body["elapsed_ms"] >= 0


def test_views_are_named_by_uuid_too_and_params_bind(
    service: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    alerts, prices = inputs
    token = mint(inputs)
    query = (
        f"SELECT count(*) AS n FROM dataset_{alerts.dataset_uuid.hex} a "
        f"JOIN dataset_{prices.dataset_uuid.hex} p USING (block) WHERE a.severity = ?"
    )
    answer = ask(service, token, query, params=["critical"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["rows"] == [[1]]


def test_values_json_cannot_hold_answer_null(
    service: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    query = "SELECT 'nan'::DOUBLE AS n, 'inf'::DOUBLE AS i, [1.5, 'nan'::DOUBLE] AS l FROM prices"
    answer = ask(service, mint(inputs), query + " LIMIT 1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["rows"] == [[None, None, [1.5, None]]]


def test_csv_and_arrow_answers(service: httpx.Client, inputs: tuple[Dataset, Dataset]) -> None:
    token = mint(inputs)
    as_csv = ask(service, token, JOIN, format="csv")
    assert as_csv.status_code == 200 and as_csv.headers["content-type"].startswith("text/csv")
    assert as_csv.text.splitlines() == ["block,severity,price", "1,low,1.5", "2,critical,3.0"]
    as_arrow = ask(service, token, JOIN, format="arrow")
    assert as_arrow.status_code == 200, as_arrow.text
    table = pa.ipc.open_stream(as_arrow.content).read_all()
    assert table.column_names == ["block", "severity", "price"]
    assert table.column("block").to_pylist() == [1, 2]
    assert as_arrow.headers["x-taskplat-row-count"] == "2"


def test_answers_stop_at_the_row_and_byte_limits(
    reader_url: str, sqs_endpoint_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    token = mint(inputs)
    with served(settings(reader_url, sqs_endpoint_url, max_rows=2, max_bytes=1024)) as service:
        capped = ask(service, token, "SELECT * FROM alerts ORDER BY block").json()
        assert (capped["row_count"], capped["truncated"]) == (2, True)
        asked = ask(service, token, "SELECT block FROM alerts ORDER BY block", max_rows=1).json()
        assert (asked["rows"], asked["truncated"]) == ([[1]], True)
        wide = ask(service, token, "SELECT repeat('x', 400) AS w FROM alerts").json()
        assert (wide["row_count"], wide["truncated"]) == (2, True)
        arrow = ask(service, token, "SELECT * FROM alerts", format="arrow")
        assert pa.ipc.open_stream(arrow.content).read_all().num_rows == 2
        assert arrow.headers["x-taskplat-truncated"] == "true"


def test_an_input_another_token_pins_does_not_exist_for_this_one(
    service: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    alerts, prices = inputs
    only_prices = mint([prices])
    refused = ask(service, only_prices, "SELECT * FROM alerts")
    assert refused.status_code == 403
    assert "alerts" in refused.json()["message"]
    refused = ask(service, only_prices, f"SELECT * FROM dataset_{alerts.dataset_uuid.hex}")
    assert refused.status_code == 403
    assert ask(service, only_prices, "SELECT count(*) FROM prices").json()["rows"] == [[3]]


def test_bad_tokens_answer_401(service: httpx.Client, inputs: tuple[Dataset, Dataset]) -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    expired = mint(inputs, now=past, life=timedelta(minutes=5))
    answer = ask(service, expired, "SELECT 1")
    assert answer.status_code == 401 and "expired" in answer.json()["message"]
    good = mint(inputs)
    header, claims, signature = good.split(".")
    for bad in (
        f"{header}.{claims}.{signature[:-2]}xx",
        mint(inputs, key=private_key_pem(b"\x79" * 32)),
        "garbage",
    ):
        answer = ask(service, bad, "SELECT 1")
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"] == "invalid_token"
    assert service.post("/query", json={"sql": "SELECT 1"}).status_code == 401


def test_bad_bodies_answer_4xx(service: httpx.Client, inputs: tuple[Dataset, Dataset]) -> None:
    token = mint(inputs)
    headers = {"Authorization": f"Bearer {token}"}
    assert service.post("/query", headers=headers, content=b"{").status_code == 422
    assert service.post("/query", headers=headers, json={"sql": ""}).status_code == 422
    assert service.post("/query", headers=headers, json={"sql": "x", "y": 1}).status_code == 422
    assert service.post("/query", headers=headers, content=b"x" * 300_000).status_code == 413
    bad_sql = ask(service, token, "SELEC 1")
    assert bad_sql.status_code == 400 and bad_sql.json()["error"] == "invalid_sql"
    no_column = ask(service, token, "SELECT nope FROM alerts")
    assert no_column.status_code == 422 and no_column.json()["error"] == "query_failed"
    assert service.get("/query").status_code == 405


def test_a_query_past_the_time_limit_answers_408_and_frees_its_slot(
    reader_url: str, sqs_endpoint_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    config = settings(reader_url, sqs_endpoint_url, timeout_seconds=1.0, concurrent_per_token=1)
    token = mint(inputs)
    with served(config) as service:
        started = time.monotonic()
        answer = ask(service, token, SLOW)
        assert answer.status_code == 408, answer.text
        assert answer.json()["error"] == "query_timeout"
        assert time.monotonic() - started < 20
        after = ask(service, token, "SELECT count(*) FROM alerts")
        assert after.status_code == 200 and after.json()["rows"] == [[3]]


def test_429_past_the_rate_and_the_running_queries_of_a_token(
    reader_url: str, sqs_endpoint_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    config = settings(
        reader_url,
        sqs_endpoint_url,
        rate_limit_per_token=3,
        concurrent_per_token=1,
        timeout_seconds=3.0,
    )
    token, other = mint(inputs), mint(inputs)
    with served(config) as service:
        results: list[httpx.Response] = []
        running = threading.Thread(target=lambda: results.append(ask(service, token, SLOW)))
        running.start()
        # Asked before the slow query was admitted, a fast one would run and use up the rate.
        wait_for(lambda: _engines(service) >= 1, timeout=10, what="the slow query admitted")

        def busy() -> bool:
            answer = ask(service, token, "SELECT 1")
            if answer.status_code == 429:
                assert answer.json()["error"] == "too_many_running"
                return True
            return False

        wait_for(busy, timeout=10, what="a second query of the token refused while one runs")
        running.join(timeout=30)
        assert [r.status_code for r in results] == [408]
        assert ask(service, other, "SELECT 1").status_code == 200  # another token
        wait_for(
            lambda: ask(service, token, "SELECT 1").status_code == 429,
            timeout=10,
            what="the token's rate used up",
        )
        refused = ask(service, token, "SELECT 1")
        assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1


def _engines(service: httpx.Client) -> int:
    """`taskplat_query_engines_opened`: queries admitted past the guard so far."""
    text = service.get("/metrics").text
    found = re.search(r"^taskplat_query_engines_opened_total (\d+(\.\d+)?)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def test_health_metrics_and_document(
    service: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    assert service.get("/healthz").json() == {"status": "ok"}
    assert service.get("/readyz").status_code == 200
    ask(service, mint(inputs), "SELECT 1")
    assert "taskplat_query_requests" in service.get("/metrics").text
    assert "/query" in service.get("/openapi.json").json()["paths"]


def test_the_query_role_reads_only_what_a_running_attempt_pins(
    reader_url: str, db_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    """The service's login has no right on any table; `taskplat_query_open` reads a version's
    table only for the attempt running now whose task pins that version."""
    import psycopg

    alerts, _ = inputs
    other = buffered_dataset(db_url, "other", [{"name": "n", "type": "bigint"}], [{"n": 1}])
    task_id = running_attempt(db_url, [alerts.pin()])
    with psycopg.connect(reader_url, autocommit=True) as conn:
        for statement in (
            f'SELECT count(*) FROM "{alerts.table}"',
            "SELECT * FROM tasks",
            "SELECT * FROM datasets",
            "SELECT * FROM dataset_tables",
            "SELECT * FROM outbox",
            f"INSERT INTO \"{alerts.table}\" (org_id, dedupe_key) VALUES (gen_random_uuid(), 'x')",
            f'DELETE FROM "{alerts.table}"',
            "CREATE TABLE query_was_here (a int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]

        def rows_read(task: uuid.UUID, attempt: int, dataset: Dataset) -> int | None:
            with conn.transaction():
                opened = conn.execute(
                    "SELECT taskplat_query_open(%s, %s, %s, %s)",
                    (task, attempt, dataset.dataset_uuid, dataset.dataset_version),
                ).fetchone()
                assert opened is not None
                if opened[0] is None:
                    return None
                return len(conn.execute(f'FETCH ALL FROM "{opened[0]}"').fetchall())  # type: ignore[arg-type]

        assert rows_read(task_id, 1, alerts) == 3
        assert rows_read(task_id, 2, alerts) is None  # not the attempt running
        assert rows_read(task_id, 1, other) is None  # a version its task does not pin
        assert rows_read(uuid.uuid4(), 1, alerts) is None  # no such task
        end_attempts(db_url, [task_id])
        assert rows_read(task_id, 1, alerts) is None  # the attempt ended


def test_a_token_reads_nothing_once_its_attempt_ended_or_beyond_its_tasks_pins(
    service: httpx.Client, db_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    """A valid token is not enough: the database answers its reads only while its attempt runs
    and only for what its task pins (a token stating more reads nothing more)."""
    alerts, prices = inputs
    task_id = running_attempt(db_url, [alerts.pin()])
    wider = mint([alerts, prices], task_id=task_id)  # states an input its task does not pin
    assert ask(service, wider, "SELECT count(*) FROM alerts").json()["rows"] == [[3]]
    assert ask(service, wider, "SELECT count(*) FROM prices").status_code == 403
    end_attempts(db_url, [task_id])
    ended = ask(service, wider, "SELECT count(*) FROM alerts")
    assert ended.status_code == 403, ended.text
    assert ended.json()["error"] == "attempt_not_running"


def test_a_task_with_no_inputs_sees_nothing(service: httpx.Client) -> None:
    token = mint([])
    assert ask(service, token, "SELECT 40 + 2 AS n").json()["rows"] == [[42]]
    assert ask(service, token, f"SELECT * FROM dataset_{uuid.uuid4().hex}").status_code == 403


def test_a_fake_clock_expires_tokens(
    reader_url: str, sqs_endpoint_url: str, inputs: tuple[Dataset, Dataset]
) -> None:
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0))
    token = mint(inputs, now=clock.now(), life=timedelta(minutes=1))
    with served(settings(reader_url, sqs_endpoint_url), clock=clock) as service:
        assert ask(service, token, "SELECT 1").status_code == 200
        clock.advance(61)
        assert ask(service, token, "SELECT 1").status_code == 401
