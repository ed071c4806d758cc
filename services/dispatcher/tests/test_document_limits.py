"""Bad documents against the real dispatcher: schedules that never fire, YAML anchors and aliases
(the "billion laughs"), documents too deep or with too many nodes. Each answers a 4xx naming the
problem, quickly, stores nothing, and never holds the event loop: `/healthz` answers meanwhile.
The limits are docs/security.md's "Document limits" (defaults: depth 64, 100,000 nodes)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

import httpx
import pytest

from taskplat.testkit.dispatcher_harness import Dispatcher

YAML = {"Content-Type": "application/yaml"}
# A bad document is refused in well under this, even on a busy machine.
QUICK_SECONDS = 3.0

# The 509-byte "billion laughs": nine levels of nine aliases each, 9^9 strings once expanded.
BILLION_LAUGHS = b"""# nine levels of nine aliases: 9^9 lols expanded
jobs:
  bomb:
    operator: echo
    queue: default
    config:
      a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
      b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
      c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
      d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
      e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
      f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
      g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
      h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
      i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _timed(send: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = send()
    return answer, time.monotonic() - started


def _refused(answer: httpx.Response, status: int, *names: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    text = json.dumps(body)
    for name in names:
        assert name in text, (name, body)
    return body


def _nothing_stored(dispatcher: Dispatcher, dag: str = "x") -> None:
    assert dispatcher.api.get(f"/dags/{dag}").status_code == 404


@pytest.mark.parametrize(
    "schedule",
    ["0 0 31 2 *", "30 6 31 4,6,9,11 *"],
    ids=["february-31", "day-31-of-30-day-months"],
)
def test_a_schedule_that_never_fires_is_refused_naming_it(
    dispatcher: Dispatcher, schedule: str
) -> None:
    doc = {"jobs": {"nightly": {"operator": "echo", "schedule": schedule}}}
    body = _refused(dispatcher.api.put("/dags/x", json=doc), 422, repr(schedule), "never fires")
    (problem,) = body["detail"]
    assert problem["loc"] == ["body", "jobs", "nightly", "schedule"]
    assert problem["type"] == "invalid_cron"
    _nothing_stored(dispatcher)


def test_the_billion_laughs_is_refused_at_once_and_healthz_answers(
    dispatcher: Dispatcher,
) -> None:
    assert len(BILLION_LAUGHS) == 509
    answer, took = _timed(
        lambda: dispatcher.api.put("/dags/x", content=BILLION_LAUGHS, headers=YAML)
    )
    body = _refused(answer, 422, "YAML anchors are refused", "&a")
    assert body["error"] == "document_refused" and body["detail"][0]["type"] == "yaml_anchor"
    assert took < QUICK_SECONDS
    health, took = _timed(lambda: dispatcher.anonymous.get("/healthz"))
    assert health.status_code == 200 and took < QUICK_SECONDS
    _nothing_stored(dispatcher)


def test_a_yaml_anchor_alone_is_refused(dispatcher: Dispatcher) -> None:
    doc = b"jobs:\n  a: &job\n    operator: echo\n"
    body = _refused(dispatcher.api.put("/dags/x", content=doc, headers=YAML), 422, "&job")
    assert body["detail"][0]["type"] == "yaml_anchor"
    _nothing_stored(dispatcher)


def test_a_yaml_alias_is_refused(dispatcher: Dispatcher) -> None:
    doc = b"jobs:\n  a:\n    operator: echo\n    config: {x: *elsewhere}\n"
    body = _refused(dispatcher.api.put("/dags/x", content=doc, headers=YAML), 422, "*elsewhere")
    assert body["detail"][0]["type"] == "yaml_alias"


def test_json_nested_5000_deep_is_refused_quickly(dispatcher: Dispatcher) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    dag = b'{"jobs": {"a": {"operator": "echo", "config": {"x": ' + deep + b"}}}}"
    task = b'{"operator": "echo", "config": {"x": ' + deep + b"}}"
    for path, content, send in (
        ("/dags/x", dag, dispatcher.api.put),
        ("/tasks", task, dispatcher.api.post),
    ):
        answer, took = _timed(lambda: send(path, content=content))  # noqa: B023
        body = _refused(answer, 422, "64 levels deep")
        assert body["detail"][0]["type"] == "max_depth", path
        assert took < QUICK_SECONDS, path
    _nothing_stored(dispatcher)


def test_yaml_nested_deep_is_refused(dispatcher: Dispatcher) -> None:
    flow = b"jobs:\n  a:\n    operator: echo\n    config:\n      x: " + b"[" * 5000 + b"]" * 5000
    block = b"jobs:\n  a:\n    operator: echo\n    config:\n" + b"".join(
        b"  " * (level + 3) + b"k:\n" for level in range(80)
    )
    for doc in (flow, block):
        answer, took = _timed(lambda: dispatcher.api.put("/dags/x", content=doc, headers=YAML))  # noqa: B023
        body = _refused(answer, 422, "64 levels deep")
        assert body["detail"][0]["type"] == "max_depth"
        assert took < QUICK_SECONDS
    _nothing_stored(dispatcher)


def test_a_body_with_too_many_nodes_is_refused(dispatcher: Dispatcher) -> None:
    many = [0] * 100_001
    task = dispatcher.api.post("/tasks", json={"operator": "echo", "config": {"x": many}})
    assert _refused(task, 422, "100000 nodes")["detail"][0]["type"] == "max_nodes"
    dag = {"jobs": {"a": {"operator": "echo", "config": {"x": many}}}}
    assert _refused(dispatcher.api.put("/dags/x", json=dag), 422, "100000 nodes")
    as_yaml = b"jobs:\n  a:\n    operator: echo\n    config:\n      x: [" + b"0," * 100_001 + b"]"
    assert _refused(dispatcher.api.put("/dags/x", content=as_yaml, headers=YAML), 422, "nodes")
    assert dispatcher.api.get("/tasks").json()["tasks"] == []
    _nothing_stored(dispatcher)


def test_a_large_valid_document_does_not_block_healthz(dispatcher: Dispatcher) -> None:
    """A large YAML document within the limits takes the dispatcher a while to parse and check;
    meanwhile `/healthz` keeps answering (the parsing runs off the event loop). Parsed on the
    loop, each `/healthz` asked meanwhile would wait about as long as the whole apply."""
    values = b",".join(b"%d" % n for n in range(30_000))
    doc = b"jobs:\n  big:\n    operator: echo\n    config:\n      values: [" + values + b"]\n"
    applied: dict[str, Any] = {}

    def apply() -> None:
        with httpx.Client(base_url=dispatcher.base_url, headers=dispatcher.api.headers) as api:
            applied["answer"], applied["took"] = _timed(
                lambda: api.put("/dags/big", content=doc, headers=YAML, timeout=120)
            )

    thread = threading.Thread(target=apply)
    thread.start()
    latencies: list[float] = []
    while thread.is_alive():
        answer, took = _timed(lambda: dispatcher.anonymous.get("/healthz", timeout=30))
        assert answer.status_code == 200
        if thread.is_alive():
            latencies.append(took)
    thread.join(timeout=120)
    assert applied["answer"].status_code == 201, applied["answer"].text[:500]
    # Blocked, the loop would answer no /healthz until the apply ended: one at most, as long as
    # the apply. A loaded machine can delay any one answer, so the median is held, not the max.
    assert len(latencies) >= 2, "the document was applied before /healthz was asked twice"
    assert statistics.median(latencies) < applied["took"] / 3, (applied["took"], latencies)
