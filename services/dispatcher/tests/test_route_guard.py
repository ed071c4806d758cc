"""The route guard: refused calls of audited routes are in the audit log, written in their own
transaction (the refused call's rollback does not take them along); `GET /audit` needs `admin`;
the attempt scope is checked by the guard from the route's declared body model, so a handler
that reads its body another way is still checked."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from test_access import client, new_key
from test_audit_workers import audit_rows

from taskplat.common.contracts import HeartbeatRequest
from taskplat.common.errors import Forbidden
from taskplat.dispatcher import audit
from taskplat.dispatcher.route_guard import RouteSpec, audit_call, guarded
from taskplat.testkit.dispatcher_calls import claim, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher


def _add(dispatcher: Dispatcher, spec: RouteSpec, scope: Any = None) -> None:
    """Serve one more route, guarded like the app's own."""
    route = Route(spec.path, guarded(spec, scope), methods=[spec.method], name=spec.name)
    dispatcher.app.router.routes.insert(0, route)


def test_refused_calls_of_audited_routes_are_recorded(dispatcher: Dispatcher, db_url: str) -> None:
    task_id = create_task(dispatcher)["task_id"]
    reader = new_key(dispatcher, "reader", "read", "submit")
    before = len(audit_rows(db_url))
    assert dispatcher.anonymous.put(f"/tasks/{task_id}/cancel").status_code == 401
    with client(dispatcher, "tpk_not-a-key-of-this-platform") as nobody:
        assert nobody.put("/queues/default/pause").status_code == 401
    with client(dispatcher, reader) as c:
        assert c.put(f"/tasks/{task_id}/cancel").status_code == 403
        assert c.get("/audit").status_code == 403
        assert c.get("/tasks").status_code == 200  # a read route: not audited
        assert c.post("/tasks", json={"operator": "echo"}).status_code == 201  # submit: neither
    rows = audit_rows(db_url)[before:]
    assert rows == [
        {"key_name": audit.NO_KEY, "action": "cancel_task", "target": task_id,
         "outcome": "refused 401"},
        {"key_name": audit.NO_KEY, "action": "pause_queue", "target": "default",
         "outcome": "refused 401"},
        {"key_name": "reader", "action": "cancel_task", "target": task_id,
         "outcome": "refused 403"},
        {"key_name": "reader", "action": "list_audit", "target": None, "outcome": "refused 403"},
    ]  # fmt: skip
    with psycopg.connect(db_url) as conn:
        detail = conn.execute(
            "SELECT detail FROM audit_log WHERE key_name = 'reader' ORDER BY audit_id LIMIT 1"
        ).fetchone()
    assert detail is not None and detail[0]["missing_scope"] == "operate"
    assert dispatcher.api.get(f"/tasks/{task_id}").json()["status"] == "Queued"


def test_a_refusal_inside_the_handler_survives_its_rollback(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """A handler that wrote its audit row and then refused: the row of its transaction goes with
    the rollback, the refusal's own row stays."""

    async def refuses(request: Request) -> Response:
        call = audit_call(request)
        async with request.app.state.pool.connection() as conn, conn.transaction():
            await audit.record(conn, call, "written before the refusal")
            raise Forbidden("refused after writing", detail={"reason": "test"})

    spec = RouteSpec("PUT", "/test/refuses/{thing}", "test_refuses", "", "api_key", refuses)
    _add(dispatcher, spec, "operate")
    before = len(audit_rows(db_url))
    response = dispatcher.api.put("/test/refuses/t1")
    assert response.status_code == 403, response.text
    assert audit_rows(db_url)[before:] == [
        {"key_name": "bootstrap", "action": "test_refuses", "target": "t1",
         "outcome": "refused 403"},
    ]  # fmt: skip


def test_an_attempt_route_is_checked_by_the_guard_however_its_handler_reads_the_body(
    dispatcher: Dispatcher,
) -> None:
    seen: list[dict[str, Any]] = []

    async def raw(request: Request) -> Response:
        body: dict[str, Any] = await request.json()  # not `read_body`
        seen.append(body)
        return JSONResponse({"ok": True})

    spec = RouteSpec(
        "POST", "/internal/test-raw", "test_raw", "", "attempt", raw, body=HeartbeatRequest
    )
    _add(dispatcher, spec)
    mine, other = create_task(dispatcher)["task_id"], create_task(dispatcher)["task_id"]
    answer = claim(dispatcher, mine).json()
    headers = {"Authorization": f"Bearer {answer['attempt_token']}"}
    fence = {"attempt": answer["attempt"], "lease_token": answer["lease_token"]}
    with httpx.Client(base_url=dispatcher.base_url, headers=headers, timeout=30) as attempt:
        refused = attempt.post("/internal/test-raw", json={"task_id": other, **fence})
        assert refused.status_code == 403, refused.text
        later = attempt.post("/internal/test-raw", json={"task_id": mine, **fence, "attempt": 2})
        assert later.status_code == 403, later.text
        assert seen == []  # the handler never ran
        own = attempt.post("/internal/test-raw", json={"task_id": mine, **fence})
        assert own.status_code == 200, own.text
    assert seen == [{"task_id": mine, **fence}]  # the handler read the same bytes
    # The worker token is not attempt-scoped: the handler reads the body itself.
    assert dispatcher.worker.post("/internal/test-raw", json={"task_id": other}).status_code == 200


def test_an_attempt_route_without_a_body_model_naming_the_attempt_is_refused() -> None:
    async def handler(request: Request) -> Response:
        return JSONResponse({})

    with pytest.raises(ValueError, match="task_id and attempt"):
        guarded(RouteSpec("POST", "/internal/x", "x", "", "attempt", handler))


def test_a_large_body_of_an_attempt_token_call_is_checked_too(dispatcher: Dispatcher) -> None:
    """Over the inline size the guard validates the body off the event loop, same answers."""
    mine, other = create_task(dispatcher)["task_id"], create_task(dispatcher)["task_id"]
    answer = claim(dispatcher, mine).json()
    headers = {"Authorization": f"Bearer {answer['attempt_token']}"}
    fence = {"attempt": answer["attempt"], "lease_token": answer["lease_token"]}
    step = {"step": "big", "result": {"blob": "x" * 40_000}}
    with httpx.Client(base_url=dispatcher.base_url, headers=headers, timeout=30) as attempt:
        refused = attempt.post("/internal/steps", json={"task_id": other, **fence, **step})
        assert refused.status_code == 403, refused.text
        own = attempt.post("/internal/steps", json={"task_id": mine, **fence, **step})
        assert own.status_code == 200, own.text


def test_a_flood_of_refused_calls_writes_a_bounded_number_of_rows(
    dispatcher: Dispatcher, db_url: str
) -> None:
    per_minute = dispatcher.app.state.refusal_throttle.per_minute
    before = len(audit_rows(db_url))
    with client(dispatcher, "tpk_a-flood-of-wrong-keys") as nobody:
        for _ in range(per_minute + 25):
            assert nobody.put("/queues/default/resume").status_code == 401
    rows = [row for row in audit_rows(db_url)[before:] if row["action"] == "resume_queue"]
    assert len(rows) == per_minute
    assert {row["outcome"] for row in rows} == {"refused 401"}


def test_the_refusal_throttle_names_what_it_left_out_on_its_next_row() -> None:
    clock = [0.0]
    throttle = audit.RefusalThrottle(2, max_tracked=3, monotonic=lambda: clock[0])
    call = audit.AuditCall("k", "cancel_task", "t")
    assert [throttle.admit(call, 403) for _ in range(5)] == [0, 0, None, None, None]
    assert throttle.admit(call, 401) == 0  # another status: its own window
    clock[0] = 60.0
    assert throttle.admit(call, 403) == 3  # the first row of the next minute names the 3
    assert throttle.admit(call, 403) == 0
    assert throttle.admit(call, 403) is None
    for name in ("a", "b", "c"):  # more triples than tracked: the table is emptied, not grown
        throttle.admit(audit.AuditCall(name, "x", None), 403)
    assert len(throttle._windows) <= 3
