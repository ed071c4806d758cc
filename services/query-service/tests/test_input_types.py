"""Every column type a buffered dataset may have arrives in the sandbox with the type DuckDB's
Postgres scanner gave it (the service reads Postgres itself and hands Arrow over), NULLs
included; an input over `max_input_bytes` answers 422 before its query runs."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from query_harness import ask, buffered_dataset, mint, served, settings

COLUMNS = [
    ("t", "text"),
    ("b", "bigint"),
    ("i", "integer"),
    ("s", "smallint"),
    ("f", "boolean"),
    ("d", "double precision"),
    ("r", "real"),
    ("n", "numeric"),
    ("j", "jsonb"),
    ("u", "uuid"),
    ("ts", "timestamptz"),
    ("day", "date"),
]
ROW = {
    "t": "x",
    "b": 2**40,
    "i": 7,
    "s": 3,
    "f": True,
    "d": 1.5,
    "r": 0.25,
    "n": "12.5",
    "j": '{"a": [1, 2]}',
    "u": "00000000-0000-4000-8000-000000000001",
    "ts": "2026-01-02T03:04:05+00:00",
    "day": "2026-01-02",
}


@pytest.fixture
def small_service(reader_url: str, sqs_endpoint_url: str) -> Iterator[httpx.Client]:
    with served(settings(reader_url, sqs_endpoint_url, max_input_bytes=4096)) as client:
        yield client


def test_every_column_type_arrives_typed(service: httpx.Client, db_url: str) -> None:
    typed = buffered_dataset(
        db_url, "typed", [{"name": n, "type": t} for n, t in COLUMNS], [ROW, {}]
    )
    names = ", ".join(n for n, _ in COLUMNS)
    answer = ask(service, mint([typed]), f"SELECT {names} FROM typed ORDER BY row_id")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [c["type"] for c in body["columns"]] == [
        "VARCHAR",
        "BIGINT",
        "INTEGER",
        "SMALLINT",
        "BOOLEAN",
        "DOUBLE",
        "FLOAT",
        "DOUBLE",
        "VARCHAR",
        "VARCHAR",
        "TIMESTAMP WITH TIME ZONE",
        "DATE",
    ]
    first, empty = body["rows"]
    assert first[:8] == ["x", 2**40, 7, 3, True, 1.5, 0.25, 12.5]
    assert first[8].replace(" ", "") == '{"a":[1,2]}'
    assert first[9] == ROW["u"]
    assert first[10].startswith("2026-01-02") and first[11] == "2026-01-02"
    assert empty == [None] * len(COLUMNS)


def test_an_input_over_the_byte_cap_answers_422(small_service: httpx.Client, db_url: str) -> None:
    big = buffered_dataset(
        db_url, "big", [{"name": "t", "type": "text"}], [{"t": "x" * 100} for _ in range(100)]
    )
    answer = ask(small_service, mint([big]), "SELECT count(*) FROM big")
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "input_too_large"
    assert ask(small_service, mint([big]), "SELECT 1").status_code == 200  # reads no input
