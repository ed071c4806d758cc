"""A queue's limits through `PUT /queues/{queue}` (admin): a body replaces them, no body registers
the queue and leaves them as they are, bad input answers 422 and changes nothing; `GET /queues`
and `GET /queues/{queue}` show them with their use; each call is audited; setting limits
recounts the queue's Running tasks (docs/queue-limits.md)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_access import client, new_key
from test_audit_workers import audit_rows

from taskplat.testkit.dispatcher_calls import claimed, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher

FULL = {
    "concurrency_limit": 3,
    "key_concurrency_limit": 1,
    "rate_limit": {"per_second": 10.0, "burst": 5},
}
NONE = {"concurrency_limit": None, "key_concurrency_limit": None, "rate_limit": None}


def limits_row(db_url: str, queue: str) -> dict[str, Any] | None:
    with psycopg.connect(db_url) as conn:
        cursor = conn.execute(
            "SELECT concurrency_limit, key_concurrency_limit, rate_per_second, rate_burst,"
            " running, limits_updated_at FROM queues WHERE name = %s",
            (queue,),
        )
        row = cursor.fetchone()
        names = [column.name for column in cursor.description or []]
        return None if row is None else dict(zip(names, row, strict=True))


def test_a_body_sets_replaces_and_clears_the_limits(dispatcher: Dispatcher, db_url: str) -> None:
    made = dispatcher.api.put("/queues/limited", json=FULL)
    assert made.status_code == 201, made.text
    view = made.json()
    assert view["limits"] == FULL
    assert view["limits_use"] == {"running": 0, "keys_at_limit": 0, "tokens_left": 5}
    assert dispatcher.api.get("/queues/limited").json() == view
    listed = {q["name"]: q for q in dispatcher.api.get("/queues").json()["queues"]}
    assert listed["limited"]["limits"] == FULL
    assert listed["default"]["limits"] == NONE
    assert listed["default"]["limits_use"] == {
        "running": None, "keys_at_limit": None, "tokens_left": None,
    }  # fmt: skip

    # The body replaces every limit: what it leaves out is no limit.
    replaced = dispatcher.api.put("/queues/limited", json={"key_concurrency_limit": 2})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["limits"] == {**NONE, "key_concurrency_limit": 2}
    assert replaced.json()["limits_use"] == {
        "running": 0, "keys_at_limit": 0, "tokens_left": None,
    }  # fmt: skip
    row = limits_row(db_url, "limited")
    assert row is not None
    assert (row["concurrency_limit"], row["rate_per_second"], row["rate_burst"]) == (
        None, None, None,
    )  # fmt: skip

    # No body registers (200, already there) and leaves the limits as they are.
    again = dispatcher.api.put("/queues/limited")
    assert again.status_code == 200
    assert again.json()["limits"]["key_concurrency_limit"] == 2

    whole = dispatcher.api.put(
        "/queues/limited", json={"rate_limit": {"per_second": 2, "burst": 1}}
    )
    assert whole.json()["limits"]["rate_limit"] == {"per_second": 2.0, "burst": 1}
    cleared = dispatcher.api.put("/queues/limited", json={})
    assert cleared.status_code == 200
    assert cleared.json()["limits"] == NONE

    # No body on a new queue registers it with no limits.
    fresh = dispatcher.api.put("/queues/fresh")
    assert fresh.status_code == 201
    assert fresh.json()["limits"] == NONE


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_limit": -1}, "concurrency_limit"),
        ({"concurrency_limit": 10**9}, "concurrency_limit"),
        ({"concurrency_limit": 1.5}, "concurrency_limit"),
        ({"concurrency_limit": "3"}, "concurrency_limit"),
        ({"concurrency_limit": True}, "concurrency_limit"),
        ({"key_concurrency_limit": 0}, "key_concurrency_limit"),
        ({"rate_limit": {"per_second": 0, "burst": 1}}, "per_second"),
        ({"rate_limit": {"per_second": -2, "burst": 1}}, "per_second"),
        ({"rate_limit": {"per_second": 1e12, "burst": 1}}, "per_second"),
        ({"rate_limit": {"per_second": 5, "burst": 0}}, "burst"),
        ({"rate_limit": {"per_second": 5, "burst": True}}, "burst"),
        ({"rate_limit": {"per_second": "5", "burst": 1}}, "per_second"),
        ({"rate_limit": {"per_second": 5}}, "burst"),
        ({"rate_limit": {"burst": 5}}, "per_second"),
        ({"rate_limit": {"per_second": 5, "burst": 1, "window": 1}}, "window"),
        ({"concurrency": 3}, "concurrency"),
    ],
)
def test_bad_limits_answer_422_naming_the_field_and_change_nothing(
    dispatcher: Dispatcher, db_url: str, body: dict[str, Any], field: str
) -> None:
    assert dispatcher.api.put("/queues/limited", json=FULL).status_code == 201
    before = limits_row(db_url, "limited")
    response = dispatcher.api.put("/queues/limited", json=body)
    assert response.status_code == 422, response.text
    assert field in response.text
    assert limits_row(db_url, "limited") == before
    # A new queue named with bad limits is not registered either.
    assert dispatcher.api.put("/queues/never", json=body).status_code == 422
    assert limits_row(db_url, "never") is None


def test_malformed_json_answers_400_and_changes_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    assert dispatcher.api.put("/queues/limited", json=FULL).status_code == 201
    before = limits_row(db_url, "limited")
    response = dispatcher.api.put(
        "/queues/limited", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert limits_row(db_url, "limited") == before


def test_only_admin_sets_limits_and_every_call_is_audited(
    dispatcher: Dispatcher, db_url: str
) -> None:
    ops = new_key(dispatcher, "ops", "operate", "read", "submit")
    with client(dispatcher, ops) as c:
        assert c.put("/queues/default", json=FULL).status_code == 403
        assert c.get("/queues/default").json()["limits"] == NONE
    refused = limits_row(db_url, "default")
    assert refused is not None and refused["concurrency_limit"] is None
    assert dispatcher.api.put("/queues/default", json=FULL).status_code == 200
    assert dispatcher.api.put("/queues/new-one", json={"concurrency_limit": 2}).status_code == 201
    assert dispatcher.api.put("/queues/default", json={"concurrency_limit": 0}).status_code == 422
    assert audit_rows(db_url)[1:] == [
        {"key_name": "ops", "action": "register_queue", "target": "default",
         "outcome": "refused 403"},
        {"key_name": "bootstrap", "action": "register_queue", "target": "default",
         "outcome": "limits set"},
        {"key_name": "bootstrap", "action": "register_queue", "target": "new-one",
         "outcome": "registered, limits set"},
    ]  # fmt: skip
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT detail FROM audit_log WHERE outcome = 'limits set'").fetchone()
    assert row is not None and row[0]["limits"] == FULL
    after = limits_row(db_url, "default")
    assert after is not None and after["concurrency_limit"] == 3


def test_setting_limits_recounts_the_running_tasks(dispatcher: Dispatcher, db_url: str) -> None:
    tasks = [create_task(dispatcher)["task_id"] for _ in range(5)]
    for task_id in tasks[:4]:
        claimed(dispatcher, task_id)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Keys as task creation writes them: two Running under 'a', one under 'b', one without.
        for task_id, key in zip(tasks, ["a", "a", "b", None, "a"], strict=True):
            conn.execute("UPDATE tasks SET concurrency_key = %s WHERE task_id = %s", (key, task_id))
        # No concurrency or key limit: the counters are not kept.
        conn.execute("SELECT * FROM taskplat_set_queue_limits('default', NULL, NULL, 2, 4)")
        assert conn.execute("SELECT running FROM queues WHERE name = 'default'").fetchone() == (0,)
        conn.execute("SELECT * FROM taskplat_set_queue_limits('default', 10, 2, NULL, NULL)")
        assert conn.execute("SELECT running FROM queues WHERE name = 'default'").fetchone() == (4,)
        keys = dict(
            conn.execute(
                "SELECT concurrency_key, running FROM queue_keys WHERE queue = 'default'"
            ).fetchall()
        )
    assert keys == {"a": 2, "b": 1, "": 1}
    view = dispatcher.api.get("/queues/default").json()
    assert view["limits_use"] == {"running": 4, "keys_at_limit": 1, "tokens_left": None}
    # Through the route too: a tighter key limit puts more keys at it, the count stays exact.
    answer = dispatcher.api.put("/queues/default", json={"key_concurrency_limit": 1}).json()
    assert answer["limits_use"] == {"running": 4, "keys_at_limit": 3, "tokens_left": None}
    cleared = dispatcher.api.put("/queues/default", json={}).json()
    assert cleared["limits_use"]["running"] is None
    assert limits_row(db_url, "default")["running"] == 0  # type: ignore[index]
