"""Bad input on every route answers 4xx with a JSON body naming the problem, never 500, and
writes nothing: malformed JSON, wrong types, unknown fields, out-of-range numbers, invalid UUIDs
(path, query, body), timestamps without a time zone, empty bodies, bodies over the size cap."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from taskplat.testkit.dispatcher_calls import Lease, claimed, create_task, cursor_event, output
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts, task_state

BODY_CAP = 64 * 1024
RESULT_CAP = 200
INT64_MAX = 2**63 - 1


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {"max_body_bytes": BODY_CAP, "result_max_bytes": RESULT_CAP}


@dataclass(frozen=True)
class Case:
    """One bad request: what it sends, the status it must get, what the body must name."""

    label: str
    method: str
    path: str
    status: int
    names: tuple[str, ...] = ()
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def send(self, client: httpx.Client) -> httpx.Response:
        kwargs: dict[str, Any] = {"headers": self.headers}
        if self.content is not None:
            kwargs["content"] = self.content
            kwargs["headers"] = {"Content-Type": "application/json", **self.headers}
        elif self.json is not None:
            kwargs["json"] = self.json
        if self.params is not None:
            kwargs["params"] = self.params
        return client.request(self.method, self.path, **kwargs)


def _body_routes(lease: Lease) -> dict[str, dict[str, Any]]:
    """A valid body of every route that takes one."""
    fence = lease.fence()
    return {
        "/tasks": {"operator": "echo"},
        "/internal/task-claim": {"task_id": lease.task_id, "worker_id": "w"},
        "/internal/heartbeat": fence,
        "/internal/events": {**fence, "events": [cursor_event(1)]},
        "/internal/task-complete": {**fence, "status": "Completed"},
    }


def _generic_cases(lease: Lease) -> Iterator[Case]:
    for path, valid in _body_routes(lease).items():
        yield Case(f"{path} malformed", "POST", path, 400, content=b'{"task_id": ')
        yield Case(f"{path} trailing garbage", "POST", path, 400, content=b"{} x")
        yield Case(f"{path} empty body", "POST", path, 400, content=b"")
        yield Case(f"{path} blank body", "POST", path, 400, content=b"  \n ")
        yield Case(f"{path} not utf-8", "POST", path, 400, content=b'{"operator": "\xff\xfe"}')
        yield Case(f"{path} null", "POST", path, 422, content=b"null")
        yield Case(f"{path} array", "POST", path, 422, json=[valid])
        yield Case(f"{path} string", "POST", path, 422, json="x")
        yield Case(
            f"{path} unknown field", "POST", path, 422, ("bogus",), json={**valid, "bogus": 1}
        )
        for name in valid:
            rest = {key: value for key, value in valid.items() if key != name}
            if path != "/internal/events" or name != "lease_token":
                yield Case(f"{path} missing {name}", "POST", path, 422, (name,), json=rest)
            yield Case(
                f"{path} {name} wrong type",
                "POST",
                path,
                422,
                (name,),
                json={**valid, name: {"not": "this"}},
            )
        if "task_id" in valid:
            yield Case(
                f"{path} task_id not a uuid",
                "POST",
                path,
                422,
                ("task_id",),
                json={**valid, "task_id": "not-a-uuid"},
            )
        if "lease_token" in valid:
            yield Case(
                f"{path} lease_token not a uuid",
                "POST",
                path,
                422,
                ("lease_token",),
                json={**valid, "lease_token": "1234"},
            )
        if "attempt" in valid:
            for attempt in (0, -1, 2.5, "one", 10**7, 2**64):
                yield Case(
                    f"{path} attempt {attempt!r}",
                    "POST",
                    path,
                    422,
                    ("attempt",),
                    json={**valid, "attempt": attempt},
                )


def _create_cases() -> Iterator[Case]:
    def create(label: str, names: tuple[str, ...], **fields: Any) -> Case:
        return Case(
            f"create {label}", "POST", "/tasks", 422, names, json={"operator": "echo", **fields}
        )

    yield create("operator empty", ("operator",), operator="")
    yield create("operator pattern", ("operator",), operator="rm -rf /")
    yield create("operator number", ("operator",), operator=5)
    for max_attempts in (0, 101, -1, 1.5, "many", None):
        if max_attempts is not None:
            yield create(
                f"max_attempts {max_attempts!r}", ("max_attempts",), max_attempts=max_attempts
            )
    yield create("timeout 0", ("timeout_seconds",), timeout_seconds=0)
    yield create("timeout huge", ("timeout_seconds",), timeout_seconds=10**12)
    yield create("backoff base negative", ("backoff_base_seconds",), backoff_base_seconds=-1)
    yield create("backoff max huge", ("backoff_max_seconds",), backoff_max_seconds=1e12)
    yield create("config array", ("config",), config=[1])
    yield create("inputs object", ("inputs",), inputs={"a": 1})
    yield create("queue pattern", ("queue",), queue="no spaces")
    yield create("queue long", ("queue",), queue="q" * 65)
    yield create("idempotency key empty", ("idempotency_key",), idempotency_key="")
    yield create("job incomplete", ("job",), job={"dag_name": "d"})
    yield create("job unknown field", ("job",), job={"dag_name": "d", "name": "n", "x": 1})
    for name in ("scheduled_for", "expires_at"):
        yield create(f"{name} naive", (name,), **{name: "2030-01-02T00:00:00"})
        yield create(f"{name} date only", (name,), **{name: "2030-01-02"})
        yield create(f"{name} garbage", (name,), **{name: "tomorrow"})
        yield create(f"{name} object", (name,), **{name: {"at": "2030-01-02T00:00:00Z"}})
    yield create(
        "expires before scheduled",
        ("expires_at",),
        scheduled_for="2030-01-02T00:00:00Z",
        expires_at="2030-01-01T00:00:00Z",
    )
    deep = b'{"operator": "echo", "config": {"a": ' + b"[" * 300 + b"]" * 300 + b"}}"
    # Over the document depth limit (64 by default): refused before the contract sees it.
    yield Case(
        "create nested too deep", "POST", "/tasks", 422, names=("64 levels deep",), content=deep
    )
    # Values JSON and Postgres cannot store must not reach the database as a 500.
    yield Case(
        "create config NaN",
        "POST",
        "/tasks",
        422,
        ("config",),
        content=b'{"operator": "echo", "config": {"a": NaN}}',
    )
    yield Case(
        "create config Infinity",
        "POST",
        "/tasks",
        422,
        ("config",),
        content=b'{"operator": "echo", "config": {"a": 1e400}}',
    )
    yield create("config NUL", ("config",), config={"a": "nul \u0000 here"})
    yield create("inputs NUL", ("inputs",), inputs=["\u0000"])
    yield create("idempotency key NUL", ("idempotency_key",), idempotency_key="a\u0000b")


def _worker_cases(lease: Lease) -> Iterator[Case]:
    fence = lease.fence()
    claim = "/internal/task-claim"
    yield Case(
        "claim worker_id empty",
        "POST",
        claim,
        422,
        ("worker_id",),
        json={"task_id": lease.task_id, "worker_id": ""},
    )
    yield Case(
        "claim worker_id NUL",
        "POST",
        claim,
        422,
        ("worker_id",),
        json={"task_id": lease.task_id, "worker_id": "w\u0000"},
    )

    events = "/internal/events"

    def event_case(label: str, names: tuple[str, ...], events_value: Any) -> Case:
        return Case(
            f"events {label}", "POST", events, 422, names, json={**fence, "events": events_value}
        )

    good = cursor_event(1)
    yield event_case("empty list", ("events",), [])
    yield event_case(
        "cursor and partition",
        ("events",),
        [{**good, "partition_key": "1-2", "start": 1, "end": 2}],
    )
    yield event_case("start without end", ("events",), [{**good, "cursor": None, "start": 1}])
    yield event_case(
        "start after end",
        ("events",),
        [{**good, "cursor": None, "partition_key": "p", "start": 5, "end": 1}],
    )
    yield event_case("dataset_uuid", ("dataset_uuid",), [{**good, "dataset_uuid": "x"}])
    yield event_case("dataset_version", ("dataset_version",), [{**good, "dataset_version": 7}])
    yield event_case("cursor text", ("cursor",), [{**good, "cursor": "ten"}])
    yield event_case("cursor over int64", ("cursor",), [{**good, "cursor": INT64_MAX + 1}])
    yield event_case(
        "range over int64",
        ("end",),
        [{**good, "cursor": None, "partition_key": "p", "start": 0, "end": INT64_MAX + 1}],
    )
    yield event_case("unknown event field", ("color",), [{**good, "color": "red"}])

    complete = "/internal/task-complete"

    def complete_case(label: str, names: tuple[str, ...], **fields: Any) -> Case:
        return Case(
            f"complete {label}",
            "POST",
            complete,
            422,
            names,
            json={**fence, "status": "Completed", **fields},
        )

    yield complete_case("status", ("status",), status="Done")
    yield complete_case("duplicate output_index", ("output_index",), outputs=[output(0), output(0)])
    yield complete_case("negative output_index", ("output_index",), outputs=[output(-1)])
    yield complete_case("negative row_count", ("row_count",), outputs=[output(0, row_count=-1)])
    yield complete_case(
        "output cursor over int64", ("cursor",), outputs=[output(0, cursor=INT64_MAX + 1)]
    )
    yield complete_case(
        "row_count over int64", ("row_count",), outputs=[output(0, row_count=INT64_MAX + 1)]
    )
    yield complete_case(
        "output dataset_uuid", ("dataset_uuid",), outputs=[output(0, dataset_uuid="nope")]
    )
    yield complete_case(
        "retry_after negative", ("retry_after_seconds",), status="Failed", retry_after_seconds=-1
    )
    yield complete_case(
        "retry_after huge", ("retry_after_seconds",), status="Failed", retry_after_seconds=1e9
    )
    yield complete_case("result array", ("result",), result=[1, 2])
    yield complete_case("result over its cap", ("result",), result={"x": "y" * RESULT_CAP})
    yield complete_case(
        "error_message too long", ("error_message",), status="Failed", error_message="e" * 16_385
    )
    yield complete_case(
        "error_message NUL", ("error_message",), status="Failed", error_message="bad\u0000"
    )
    yield complete_case("result NUL", ("result",), result={"a": "\u0000"})
    yield Case(
        "complete result NaN",
        "POST",
        complete,
        422,
        ("result",),
        content=(
            b'{"task_id": "%s", "attempt": 1, "lease_token": "%s", '
            b'"status": "Completed", "result": {"a": NaN}}'
            % (lease.task_id.encode(), lease.lease_token.encode())
        ),
    )


def _path_and_query_cases() -> Iterator[Case]:
    for bad in ("not-a-uuid", "123", "00000000-0000-0000-0000-00000000000g"):
        yield Case(f"get {bad}", "GET", f"/tasks/{bad}", 422, ("task_id",))
        yield Case(f"cancel {bad}", "PUT", f"/tasks/{bad}/cancel", 422, ("task_id",))
        yield Case(f"retry {bad}", "POST", f"/tasks/{bad}/retry", 422, ("task_id",))
        yield Case(
            f"fetch {bad}",
            "GET",
            "/internal/task-fetch",
            422,
            ("task_id",),
            params={"task_id": bad},
        )
    fetch = "/internal/task-fetch"
    yield Case("fetch without task_id", "GET", fetch, 422, ("task_id",))
    yield Case(
        "fetch unknown parameter",
        "GET",
        fetch,
        422,
        ("extra",),
        params={"task_id": "00000000-0000-0000-0000-000000000001", "extra": "1"},
    )
    for params, name in (
        ({"status": "Sleeping"}, "status"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"queue": "bad queue"}, "queue"),
        ({"cursor": "garbage!"}, "cursor"),
        ({"cursor": "WyIyMDMwLTAxLTAxVDAwOjAwOjAwIiwgIngiXQ"}, "cursor"),  # naive time, bad id
        ({"cursor": "x" * 600}, "cursor"),
        ({"bogus": "1"}, "bogus"),
        ({"limit": ["1", "2"]}, "limit"),
    ):
        yield Case(f"list {params}", "GET", "/tasks", 422, (name,), params=params)


def test_every_bad_request_answers_4xx_naming_the_problem_and_writes_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    before = task_state(db_url, lease.task_id)
    counts = row_counts(db_url)
    cases = [
        *_generic_cases(lease),
        *_create_cases(),
        *_worker_cases(lease),
        *_path_and_query_cases(),
    ]
    failures: list[str] = []
    for case in cases:
        client = dispatcher.api if case.path.startswith("/tasks") else dispatcher.worker
        response = case.send(client)
        problem = _check(case, response)
        if problem:
            failures.append(f"{case.label}: {problem}")
    assert not failures, "\n".join(failures)
    assert task_state(db_url, lease.task_id) == before
    assert row_counts(db_url) == counts
    # The valid requests those cases were built from do work: the cases failed for their flaw.
    assert dispatcher.worker.post("/internal/heartbeat", json=lease.fence()).status_code == 200


def _check(case: Case, response: httpx.Response) -> str | None:
    if response.status_code != case.status:
        return f"answered {response.status_code}, expected {case.status}: {response.text[:300]}"
    if not response.headers.get("content-type", "").startswith("application/json"):
        return f"not JSON: {response.headers.get('content-type')}"
    body = response.json()
    if not isinstance(body, dict) or not body.get("error") or not body.get("message"):
        return f"no error code and message: {body}"
    if "Traceback" in response.text:
        return "leaks a traceback"
    named = str(body.get("detail")) + body["message"]
    missing = [name for name in case.names if name not in named]
    if missing:
        return f"does not name {missing}: {body}"
    return None


def test_a_body_over_the_cap_answers_413(dispatcher: Dispatcher, db_url: str) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    before = task_state(db_url, lease.task_id)
    counts = row_counts(db_url)
    padding = "p" * (BODY_CAP + 10)
    big_bodies = {
        "/tasks": {"operator": "echo", "config": {"pad": padding}},
        "/internal/task-complete": {
            **lease.fence(),
            "status": "Completed",
            "result": {"pad": padding},
        },
        "/internal/events": {**lease.fence(), "events": [cursor_event(1)], "pad": padding},
    }
    for path, body in big_bodies.items():
        client = dispatcher.api if path.startswith("/tasks") else dispatcher.worker
        response = client.post(path, json=body)
        assert response.status_code == 413, (path, response.text)
        assert response.json()["error"] == "payload_too_large"

        # Without a Content-Length (chunked), the cap holds while the body streams in.
        raw = httpx.Request("POST", "/", json=body).content

        def chunks(raw: bytes = raw) -> Iterator[bytes]:
            for start in range(0, len(raw), 4096):
                yield raw[start : start + 4096]

        streamed = client.post(path, content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413, (path, streamed.text)
        assert streamed.json()["error"] == "payload_too_large"
    assert task_state(db_url, lease.task_id) == before
    assert row_counts(db_url) == counts

    # Just under the cap is fine.
    fits = {"operator": "echo", "config": {"pad": "p" * (BODY_CAP - 100)}}
    assert dispatcher.api.post("/tasks", json=fits).status_code == 201


def test_unknown_routes_and_methods_answer_json(dispatcher: Dispatcher) -> None:
    for method, path, status in (
        ("GET", "/nope", 404),
        ("GET", "/internal/nope", 404),
        ("DELETE", "/tasks", 405),
        ("POST", "/internal/task-fetch", 405),
        ("GET", "/internal/task-complete", 405),
    ):
        response = dispatcher.api.request(method, path)
        assert response.status_code == status, (method, path, response.text)
        assert response.json()["error"] in ("not_found", "method_not_allowed")
