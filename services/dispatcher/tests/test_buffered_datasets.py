"""Buffered Postgres datasets on apply, against a real Postgres: the table and the view, names and
types outside the allow-list refused whole (nothing stored), a changed schema is a new version with
a new table (the old one untouched), the same schema again changes nothing, a rollover by hand gives
the new version a table of the same schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.common.db.queries import parse_queries
from taskplat.testkit.dispatcher_harness import Dispatcher

_SQL_PATH = Path(__file__).with_name("buffered_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))


def _rows(db_url: str, name: str, **params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(Q[name], params).fetchall()


def _doc(schema: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "jobs": {
            "produce": {
                "operator": "echo",
                "outputs": [
                    {"index": 0, "dataset": "alerts", "kind": "buffered_postgres",
                     "schema": schema},
                ],
            },
            "consume": {"operator": "echo", "inputs": [{"from": {"dataset": "alerts"}}]},
        }
    }  # fmt: skip


SCHEMA = [{"name": "severity", "type": "text"}, {"name": "payload", "type": "jsonb"},
          {"name": "created_at", "type": "timestamp with time zone"}]  # fmt: skip


def _dataset(d: Dispatcher) -> dict[str, Any]:
    (listed,) = d.api.get("/datasets").json()["datasets"]
    view: dict[str, Any] = d.api.get(f"/datasets/{listed['dataset_uuid']}").json()
    return view


def test_apply_creates_the_table_and_the_view_shows_the_schema(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    assert d.api.put("/dags/alerts", json=_doc(SCHEMA)).status_code == 201
    view = _dataset(d)
    uuid = view["dataset_uuid"]
    assert view["kind"] == "buffered_postgres"
    assert view["schema"] == [
        {"name": "org_id", "type": "uuid"}, {"name": "dedupe_key", "type": "text"},
        {"name": "severity", "type": "text"}, {"name": "payload", "type": "jsonb"},
        {"name": "created_at", "type": "timestamptz"},
    ]  # fmt: skip
    assert view["schema_hash"].startswith("sha256:") and len(view["schema_hash"]) == 71
    # The sink creates the queue: until then the view says so with null.
    assert view["buffer_queue_url"] is None
    assert view["row_count"] == 0
    assert view["location"] == f"postgres_table:dataset_{uuid}"
    columns = _rows(db_url, "table_columns", table_name=f"dataset_{uuid}")
    assert [(c["column_name"], c["data_type"]) for c in columns] == [
        ("row_id", "bigint"), ("org_id", "uuid"), ("dedupe_key", "text"),
        ("severity", "text"), ("payload", "jsonb"),
        ("created_at", "timestamp with time zone"),
    ]  # fmt: skip
    # The same schema (spelled with aliases) again: same version, same table.
    same = [{"name": "severity", "type": "TEXT"}, {"name": "payload", "type": "jsonb"},
            {"name": "created_at", "type": "timestamptz"}]  # fmt: skip
    assert d.api.put("/dags/alerts", json=_doc(same)).status_code == 200
    again = _dataset(d)
    assert again["current_version"] == view["current_version"]
    assert again["schema_hash"] == view["schema_hash"]


def test_a_changed_schema_is_a_new_version_with_a_new_table(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    d.api.put("/dags/alerts", json=_doc(SCHEMA))
    first = _dataset(d)
    changed = [*SCHEMA, {"name": "score", "type": "bigint"}]
    assert d.api.put("/dags/alerts", json=_doc(changed)).status_code == 200
    second = _dataset(d)
    uuid = first["dataset_uuid"]
    assert second["current_version"] != first["current_version"]
    assert second["schema_hash"] != first["schema_hash"]
    assert second["schema"][-1] == {"name": "score", "type": "bigint"}
    assert second["location"] == f"postgres_table:dataset_{uuid}_v2"
    tables = _rows(db_url, "dataset_tables", dataset_uuid=uuid)
    assert [(t["ordinal"], t["table_name"]) for t in tables] == [
        (1, f"dataset_{uuid}"),
        (2, f"dataset_{uuid}_v2"),
    ]
    old = _rows(db_url, "table_columns", table_name=f"dataset_{uuid}")
    assert "score" not in {c["column_name"] for c in old}
    # A rollover by hand: a third table of the same schema.
    rolled = d.api.post(f"/datasets/{uuid}/versions", json={}).json()["dataset"]
    assert rolled["schema_hash"] == second["schema_hash"]
    assert rolled["location"] == f"postgres_table:dataset_{uuid}_v3"
    # A rollback to the first version names its table (and schema) again; no table is dropped.
    back = d.api.post(
        f"/datasets/{uuid}/current", json={"dataset_version": first["current_version"]}
    ).json()["dataset"]
    assert back["location"] == f"postgres_table:dataset_{uuid}"
    assert back["schema_hash"] == first["schema_hash"] and back["schema"] == first["schema"]
    assert len(_rows(db_url, "dataset_tables", dataset_uuid=uuid)) == 3


@pytest.mark.parametrize(
    ("column", "field"),
    [
        ({"name": "Severity", "type": "text"}, "name"),
        ({"name": "row_id", "type": "text"}, "name"),
        ({"name": "pg_x", "type": "text"}, "name"),
        ({"name": "x", "type": "text; DROP TABLE tasks"}, "type"),
        ({"name": "x", "type": "money"}, "type"),
        ({"name": "org_id", "type": "text"}, "name"),
    ],
)
def test_a_column_outside_the_allow_list_is_refused(
    dispatcher: Dispatcher, column: dict[str, str], field: str
) -> None:
    d = dispatcher
    response = d.api.put("/dags/alerts", json=_doc([column]))
    assert response.status_code == 422, response.text
    (problem,) = response.json()["detail"]
    assert problem["loc"][-3:] == ["schema", 0, field]
    assert d.api.get("/datasets").json()["datasets"] == []


def test_a_schema_on_another_kind_is_refused(dispatcher: Dispatcher) -> None:
    doc = _doc(SCHEMA)
    doc["jobs"]["produce"]["outputs"][0]["kind"] = "postgres"
    response = dispatcher.api.put("/dags/alerts", json=doc)
    assert response.status_code == 422 and "schema" in response.text


def test_the_table_function_refuses_anything_but_a_dataset_table(db_url: str) -> None:
    good = "dataset_00000000-0000-4000-8000-000000000001"
    cases = [
        ("tasks_copy", [{"name": "org_id", "type": "uuid"}]),
        (good + "; DROP TABLE tasks", [{"name": "org_id", "type": "uuid"}]),
        (good, [{"name": "x", "type": "text; DROP TABLE tasks"}]),
        (good, [{"name": "X y", "type": "text"}]),
        (good, [{"name": "row_id", "type": "text"}]),
    ]
    for table, columns in cases:
        with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(
                "SELECT taskplat_create_dataset_table(%s, %s::jsonb)",
                (table, json.dumps(columns)),
            )
