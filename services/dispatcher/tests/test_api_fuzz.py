"""Schemathesis against the live dispatcher's own `/openapi.json`: every public and internal route.

Invariants checked: the document is a valid OpenAPI 3.1 document; for every generated request
(valid and invalid bodies, parameters and ids: schemathesis's positive and negative modes) the
dispatcher answers no 5xx, every answer conforms to the document (documented status code, content
type, headers, body schema), a request the document forbids is refused, auth is enforced, and a
request the document allows is accepted (except where `NOT_EXPRESSIBLE` names a rule JSON Schema
cannot state; the request is then refused with a 422 naming it).

How the fuzzer reaches past 404s and 401s: one dispatcher (its own database) serves the whole
module, seeded with real state (queued tasks, a claimed task with its lease and attempt token, a
DAG with a dataset and an event); each generated case is sent with the credentials its route
takes (the API key, or the worker token on `/internal/*`), and in a share of the cases the ids in
its path and body (`task_id`, `attempt`, `lease_token`, `dag_name`, `job`, `dataset_uuid`,
`queue`) are swapped for real ones, chosen deterministically from the case itself.

Bounded and deterministic: `max_examples` per operation, hypothesis `derandomize=True` (the same
cases every run), no example database, no per-example deadline (the module's pytest timeout
bounds it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from taskplat.dispatcher.openapi import build_openapi
from taskplat.testkit.dispatcher_calls import claimed, create_task, cursor_event, emit_events
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, Dispatcher, serve_dispatcher
from taskplat.testkit.testdb import TemplateDatabases

MAX_EXAMPLES = 15
# Share of cases whose ids are swapped for real ones (the rest keep the fuzzer's own values).
REAL_ID_SHARE = 0.6

PIPELINE: dict[str, Any] = {
    "jobs": {
        "source": {"operator": "emit", "queue": "default",
                   "outputs": [{"index": 0, "dataset": "blocks"}]},
        "sink": {"operator": "echo", "inputs": [{"from": {"job": "source", "output_index": 0}}]},
    }
}  # fmt: skip


@dataclass
class Seeded:
    """The live dispatcher and the real ids a case may borrow."""

    dispatcher: Dispatcher
    values: dict[str, list[Any]] = field(default_factory=dict)

    def borrow(self, case: Case) -> None:
        """Swap, for a deterministic share of cases, the case's ids for real ones. Only a value
        that is valid where it stands is swapped, so a negative case keeps what makes it invalid
        (and the dispatcher must still refuse it, now past the 404 of an unknown id)."""
        key = json.dumps(
            [case.operation.label, case.path_parameters, case.query, _jsonable(case.body)],
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(key.encode()).digest()
        if digest[0] / 255 >= REAL_ID_SHARE:
            return
        pick = digest[1]
        for params in (case.path_parameters, case.query):
            if isinstance(params, dict):
                for name, value in params.items():
                    if self.values.get(name) and _valid(name, value):
                        params[name] = _choose(self.values[name], pick)
        _swap_body(case.body, self.values, pick)


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FENCE = ("task_id", "attempt", "lease_token")


def _valid(name: str, value: Any) -> bool:
    """Whether `value` is a valid value of the id field `name` (so swapping it keeps validity)."""
    if name in ("task_id", "lease_token", "dataset_uuid", "dataset_version"):
        return isinstance(value, str) and bool(_UUID.match(value))
    if name == "attempt":
        return type(value) is int and value >= 1
    return isinstance(value, str) and bool(_NAME.match(value))


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _choose(options: list[Any], pick: int) -> Any:
    return options[pick % len(options)]


def _swap_body(body: Any, values: dict[str, list[Any]], pick: int) -> None:
    if isinstance(body, dict):
        fence = all(name in body and _valid(name, body[name]) for name in _FENCE)
        if fence:
            body.update(_choose(values["lease"], pick))  # a real task, attempt and lease token
        for name, item in body.items():
            if name in _FENCE and fence:
                continue
            if name == "task_ids" and isinstance(item, list):
                body[name] = [
                    _choose(values["task_id"], pick + i) if _valid("task_id", each) else each
                    for i, each in enumerate(item)
                ]
            elif name in values and name != "lease" and _valid(name, item):
                body[name] = _choose(values[name], pick)
            else:
                _swap_body(item, values, pick)
    elif isinstance(body, list):
        for item in body:
            _swap_body(item, values, pick)


def _seed(dispatcher: Dispatcher) -> dict[str, list[Any]]:
    api = dispatcher.api
    assert api.put("/dags/fuzz", json=PIPELINE).status_code == 201
    source = api.post("/dags/fuzz/jobs/source/runs", json={}).json()
    lease = claimed(dispatcher, source["task_id"])
    dataset = next(iter(api.get("/datasets").json()["datasets"]))
    dataset_uuid = dataset["dataset_uuid"]
    version = dataset["current_version"]
    events = emit_events(dispatcher, lease, [cursor_event(1, dataset_uuid, version)])
    assert events.status_code == 200, events.text
    queued = [create_task(dispatcher, operator="echo")["task_id"] for _ in range(3)]
    running = [claimed(dispatcher, create_task(dispatcher, operator="echo")["task_id"])]
    task_ids = [lease.task_id, *queued, *(each.task_id for each in running)]
    return {
        "task_id": task_ids,
        "lease": [lease.fence(), *(each.fence() for each in running)],
        "dag_name": ["fuzz"],
        "dag": ["fuzz"],
        "job": ["source", "sink"],
        "dataset_uuid": [dataset_uuid],
        "dataset_version": [version],
        "queue": ["default"],
        "operator": ["echo", "emit"],
    }


@pytest.fixture(scope="module")
def seeded(template_databases: TemplateDatabases) -> Iterator[Seeded]:
    url = template_databases.clone("fuzz")
    try:
        # A claim-next that waits answers within a fraction of a second, whatever it asks.
        with serve_dispatcher(url, claim_max_wait_seconds=0.2) as dispatcher:
            yield Seeded(dispatcher, _seed(dispatcher))
    finally:
        template_databases.drop(url)


@pytest.fixture(scope="module")
def api_schema(seeded: Seeded) -> schemathesis.BaseSchema:
    raw = seeded.dispatcher.anonymous.get("/openapi.json").json()
    return schemathesis.openapi.from_dict(raw)


def test_the_openapi_document_is_valid(api_schema: schemathesis.BaseSchema) -> None:
    api_schema.validate()


def _mappings_with_key_patterns(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        if "patternProperties" in schema:
            yield schema
        for value in schema.values():
            yield from _mappings_with_key_patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _mappings_with_key_patterns(item)


def test_mapping_keys_are_documented_as_validated(seeded: Seeded) -> None:
    """A DAG's job names (found by the fuzzer): keys outside the pattern are refused, as the
    document says (not only "keys matching the pattern are jobs")."""
    document = seeded.dispatcher.anonymous.get("/openapi.json").json()
    mappings = list(_mappings_with_key_patterns(document))
    assert mappings, "the DAG document's jobs are a mapping with a key pattern"
    for mapping in mappings:
        (pattern,) = mapping["patternProperties"]
        assert mapping["additionalProperties"] is False, mapping
        assert mapping["propertyNames"]["pattern"] == pattern, mapping


# Operations where a request valid against the document may still be refused (a 422 naming the
# rule), because JSON Schema cannot state the rule: schemathesis's `positive_data_acceptance`
# check (every schema-valid request accepted) is not run on them. Every other check is.
_EVENT_POSITION = "an event's position: a cursor or a partition, `start <= end`"
NOT_EXPRESSIBLE = {
    "GET /tasks": "`cursor` is opaque: only a cursor the API returned is one",
    "GET /tasks/{task_id}/events": "`cursor` is opaque: only a cursor the API returned is one",
    "GET /datasets/{dataset_uuid}/events": "`cursor` is opaque",
    "POST /tasks": "free-form `config`/`inputs` JSON: strings with NUL cannot be stored",
    "POST /tasks/batch": "free-form `config`/`inputs` JSON: strings with NUL cannot be stored",
    "POST /dags/{dag_name}/jobs/{job}/runs": "free-form `config` JSON: strings with NUL cannot "
    "be stored",
    "POST /internal/events": _EVENT_POSITION,
    "POST /internal/task-complete": _EVENT_POSITION,
    "POST /internal/task-complete-batch": _EVENT_POSITION,
    "PUT /dags/{dag_name}": "a DAG's rules: no cycle, known jobs and output indexes, cron syntax",
}

# Operations where schemathesis's `negative_data_rejection` check is not run: once in three full
# runs it reported `GET /audit?action=0`, a valid query, as a schema-violating request accepted
# (its negative case's extra query key did not reach the request). The route's refusals of bad
# queries are tested in test_audit_workers.py; every other check runs on it.
NEGATIVE_NOT_SENT = {"GET /audit"}

# One test per operation of the document the dispatcher serves (built by the same generator).
OPERATIONS = [
    (path, method.upper()) for path, item in build_openapi()["paths"].items() for method in item
]


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_every_route_answers_within_its_document(
    path: str, method: str, api_schema: schemathesis.BaseSchema, seeded: Seeded
) -> None:
    operation = api_schema[path][method]
    label = f"{method} {path}"
    token = WORKER_TOKEN if path.startswith("/internal/") else API_KEY
    headers = {"Authorization": f"Bearer {token}"}

    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Case) -> None:
        seeded.borrow(case)
        case.call_and_validate(
            base_url=seeded.dispatcher.base_url,
            headers=headers,
            excluded_checks=[
                *([positive_data_acceptance] if label in NOT_EXPRESSIBLE else []),
                *([negative_data_rejection] if label in NEGATIVE_NOT_SENT else []),
            ],
        )

    fuzz()


def test_put_dag_with_yaml_bodies_answers_within_its_document(seeded: Seeded) -> None:
    """`PUT /dags/{dag_name}` also takes YAML (`application/yaml`, as the document says): the
    operation is fuzzed with YAML alone (the document served, narrowed to that media type, so
    every generated case is serialized as YAML), valid and invalid bodies alike, and answered
    within the document (never a 5xx). A case whose body repeats a value may reach the server
    with a YAML alias; it is refused with a 422 like every alias."""
    raw = seeded.dispatcher.anonymous.get("/openapi.json").json()
    body = raw["paths"]["/dags/{dag_name}"]["put"]["requestBody"]
    body["content"] = {"application/yaml": body["content"]["application/yaml"]}
    operation = schemathesis.openapi.from_dict(raw)["/dags/{dag_name}"]["PUT"]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    sent: list[tuple[str, int]] = []
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=MAX_EXAMPLES * 2,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Case) -> None:
        seeded.borrow(case)
        response = case.call_and_validate(
            base_url=seeded.dispatcher.base_url,
            headers=headers,
            excluded_checks=[positive_data_acceptance],
        )
        sent.append((response.request.headers.get("content-type", ""), response.status_code))

    fuzz()
    assert all(media.startswith("application/yaml") for media, _ in sent), sent
    assert any(status in (200, 201) for _, status in sent), "no YAML document was applied"
